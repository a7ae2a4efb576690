// DeepEP V2 (hybrid and direct) over the emulated SRD NIC: the tables the V2 kernels
// (hw/ep/v2_kernels.cuh) and their binding (hw/ep/v2_binding.inc) share.
//
// Why a separate header: V2 runs beside V1 LL in the same cooperative launch shape
// (EP blocks + NIC blocks), posts through the same issuer (Put, issue, post_group,
// flush_qp) and is served by the same NIC agent, so it reuses World, RankLocal and
// EpFlags as they are and adds only what V1 does not have: emulated nodes (ranks per
// node), the scale-out slots and tails of hybrid mode, the per-rank receive buffers of
// V2, and the combine's partial rows. Plain C++ (no torch): CI's nvcc compiles it.
//
// Ranks and nodes: rank r is (node r / P, local index r % P); N = R / P nodes. Several
// ranks may share one GPU, so 2 nodes x 2 ranks run on one H200; NVLink traffic between
// ranks of a node is a peer store (another GPU) or a plain store (the same GPU).
#pragma once
#include "efa_emu.cuh"

namespace emu2 {

constexpr int V2_MAX_RANKS = 16;   // the metadata holds a 16-bit slot per destination rank
constexpr int V2_MAX_NODES = 16;
constexpr int V2_RNG = 64;         // post groups a scale-out warp may have in flight between flushes

// The 28 metadata words of a dispatch message (after the FP8 payload and the scales):
// DeepEP carries the token's routing with the token; here also the slot it takes in
// every destination rank's receive buffer (computed once at the source, in token order).
constexpr int M_EPOCH = 0, M_STAMP = 1, M_TOKEN = 2;
constexpr int M_TOPK = 3;   // K <= 8 expert ids, 16 bits each: 4 words
constexpr int M_SLOT = 7;   // R <= 16 slots, 16 bits each (0xffff: no expert there): 8 words
constexpr int M_WORDS = 28;

enum V2Proto : int { V2_HYBRID = 1, V2_DIRECT = 2 };

// Phase id of the profiler rows for forwarding (hw/profiler.py maps it to "forward").
constexpr unsigned PH_FORWARD = 10;

// Errors of the V2 kernels (after V1's, hw/ep/efa_emu.cuh ErrCode; names in hw/ep_v2.py).
enum V2Err : unsigned {
  ERR_V2_NOTIFY = 20,      // a rank waited for the count exchange (notify)
  ERR_V2_TAIL = 21,        // a forward warp waited for tails / receive completions of its streams
  ERR_V2_ARRIVE = 22,      // a rank waited for its tokens (forwarded or direct)
  ERR_V2_FLUSH = 23,       // a scale-out warp waited for its own WQEs' send completions
  ERR_V2_PART = 24,        // a forward warp waited for a combine partial of its node
  ERR_V2_COMB = 25,        // the source waited for combine rows / signals
  ERR_V2_NODE_BAR = 26,    // the closing node barrier
  ERR_V2_SIGNAL = 27,      // a signal carried another count than the layout says
};

// One rank's V2 buffers. The device table holds every rank's (peers write into them).
struct V2Rank {
  // written by peers (NIC, NVLink stores of other ranks)
  uint8_t* final_x;              // [R][T][DMSG] tokens received, per source, at their slots
  unsigned* arrived;             // [R] tokens stored into final_x over NVLink, per source (cumulative)
  unsigned long long* expect;    // [R] epoch << 32 | tokens to expect from each source
  uint8_t* so_recv;              // [N][C][S][DMSG] hybrid: scale-out slots per (source node, channel)
  unsigned long long* so_tail;   // [N][C] epoch << 32 | finish << 31 | tail
  unsigned* so_notify;           // [N][NW] counts from the same-index rank of each node, u32 words
                                 //   (epoch & 0xffff) << 16 | count: valid word by word
  unsigned long long* sig;       // [R] direct: epoch << 32 | writes, the barrier signal per source
  uint8_t* part;                 // [R][T][P][CMSG] combine: partial rows at the forwarder
  unsigned long long* part_flag; // [R][T][P] epoch << 32 | 1 once a partial row was stored
  uint8_t* comb_rows;            // [T][R][CMSG] combine rows at the source, per contributing rank
  unsigned long long* comb_flag; // [T][R] epoch << 32 | 1 for rows stored over NVLink
  unsigned long long* comb_sig;  // [R] epoch << 32 | rows, signals of remote contributors
  unsigned long long* nbar;      // [P] closing node barrier words
  // the rank's own state
  int* slot;                     // [T][R] source: slot of token t at rank d, -1 when none
  int* cnt;                      // [R] source: tokens to rank d
  int* socnt;                    // [C][N] source: tokens of channel c to node m
  int* h_socnt;                  // [N][C] the handle: tokens per (source node, channel) stream here
  int* h_expect;                 // [R] the handle: tokens per source
  unsigned* arr_base;            // [R] arrivals consumed by earlier ops
  int* out_src;                  // [R][T] token index per (source, slot)
  int* out_cnt;                  // [R] tokens per source
  uint8_t* comb_in;              // [R][T][CMSG] combine input rows at final_x positions (BF16 at +16)
  uint8_t* comb_send;            // [R][T][CMSG] forwarder: rows reduced on the node, before the write
  unsigned long long* tail_src;  // [C][N][TAILS] sources of tail writes (one word per tail)
  unsigned* notify_src;          // [N][NW] sources of notify writes
  unsigned long long* sig_src;   // [2][R] sources of count/signal writes
  unsigned* wqe_done;            // [NQ_MAX][sq_depth] completions per SQ slot (RankLocal::wqe_done)
};

struct V2World {
  int P, N;            // ranks per node, nodes
  int C, F;            // scale-out channels and forward warps per rank
  int so_warps, fwd_warps;  // per EP block
  int S;               // slots per (source node, channel) stream: ceil(T / C)
  int NW;              // u32 words of a notify message (C + P, rounded up to 4)
  int tails;           // tail source words per (channel, node)
  V2Rank* ranks;       // [num_ranks] device
};

struct V2Run {
  int proto;      // V2Proto
  int interval;   // design.scaleout_update_interval: tokens per tail
};

}  // namespace emu2

namespace emu_host {
int launch_v2_op(const emu::World& w, const emu2::V2World& v, int op, unsigned epoch,
                 const emu::EpFlags& f, const emu2::V2Run& r, void* stream);
int coop_max_blocks_v2(int device, int threads, int smem);
}  // namespace emu_host

// Emulated EFA SRD NIC and the EP kernels' shared definitions.
//
// Why this file exists: the native path must build the NIC's real 64-byte TX
// work-queue entries and poll real completion descriptors, so the GPU pays the
// same stores, fences and polls it would on EFA. The kernels reach their queues
// only through lever_efa_nic_layout (hw/efa/nic_layout.h: SQ ring, doorbell, CQ
// ring, entry sizes, phases, QPN, keys) and a peer table (AH, remote QPN, qkey,
// rkey), and build every WQE with lever_efa_write_wqe_word (hw/efa/wqe.h), so the
// same device code posts to the emulated NIC (layouts filled by hw/ep/emu_nic.h)
// or a real EFA QP (layouts from efadv_query_qp_wqs / efadv_query_cq). The
// structures follow the EFA device interface (rdma-core providers/efa
// efa_io_defs.h); written from that description, not copied. No torch headers
// here: the binding (.cpp) is the only file that sees torch.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "../efa_io_defs.h"
#include "../efa/nic_layout.h"
#include "../efa/wqe.h"
#include "emu_nic.h"

#include <utility>

#if defined(__CUDACC__)
#define EMU_HD __host__ __device__ __forceinline__
#else
#define EMU_HD inline
#endif

namespace emu {

// ---- EFA IO definitions (TX WQE 64 or 128 B; CQEs read 16 B at the layout's entry stride) --
using ::EfaQueueType;
using ::EfaSendOp;
using ::efa_io_cdesc_common;
using ::efa_io_rdma_req;
using ::efa_io_remote_mem_addr;
using ::efa_io_rx_cdesc;
using ::efa_io_tx_buf_desc;
using ::efa_io_tx_cdesc;
using ::efa_io_tx_meta_desc;
using ::efa_io_tx_wqe;
using ::EFA_IO_RDMA_WRITE;
using ::EFA_IO_RDMA_READ;
using ::EFA_IO_SEND;
using ::EFA_IO_SEND_QUEUE;
using ::EFA_IO_RECV_QUEUE;

// short names for the kernels; the values live once, in hw/efa_io_defs.h
// meta.ctrl1
constexpr uint8_t META_OP_TYPE_MASK = ::EFA_IO_TX_META_DESC_OP_TYPE_MASK;
constexpr uint8_t META_HAS_IMM = ::EFA_IO_TX_META_DESC_HAS_IMM;
constexpr uint8_t META_INLINE_MSG = ::EFA_IO_TX_META_DESC_INLINE_MSG;
constexpr uint8_t META_META_DESC = ::EFA_IO_TX_META_DESC_META_DESC;
// meta.ctrl2
constexpr uint8_t META_PHASE = ::EFA_IO_TX_META_DESC_PHASE;
constexpr uint8_t META_FIRST = ::EFA_IO_TX_META_DESC_FIRST;
constexpr uint8_t META_LAST = ::EFA_IO_TX_META_DESC_LAST;
constexpr uint8_t META_COMP_REQ = ::EFA_IO_TX_META_DESC_COMP_REQ;
// cdesc flags
constexpr uint8_t CDESC_PHASE = ::EFA_IO_CDESC_COMMON_PHASE;
constexpr uint8_t CDESC_Q_TYPE_SHIFT = ::EFA_IO_CDESC_COMMON_Q_TYPE_SHIFT;
constexpr uint8_t CDESC_HAS_IMM = ::EFA_IO_CDESC_COMMON_HAS_IMM;
constexpr uint8_t CDESC_OP_TYPE_SHIFT = ::EFA_IO_CDESC_COMMON_OP_TYPE_SHIFT;
constexpr uint8_t CDESC_UNSOLICITED = ::EFA_IO_CDESC_COMMON_UNSOLICITED;

// ---- shapes ---------------------------------------------------------------
constexpr int DMSG = 7504;    // FP8 7168 + scales 224 + metadata 112
// 16-byte words of a delivering NIC warp's staging slice in dynamic shared memory
// (Fabric::copy_staged): two packets of the largest MTU the emulator takes in one slice
constexpr int STAGE_V = 1120;
// NIC warps a block at most: 8 where the NIC blocks share the EP blocks' kernel (its 255
// registers a thread fill an SM at 8 warps), 16 in a NIC kernel of its own (Fabric::own_kernel,
// compiled for 128 registers a thread)
constexpr int MAXNW = 16;
// The delivering warps' staging slices together take at most this much dynamic shared memory a
// block (beside the NIC's ~39 KiB of tables, under an SM's 227 KiB): each slice is two packets
// of the largest MTU (STAGE_V) where that fits, fewer 16-byte words where a block has more warps.
constexpr int STAGE_BUDGET_BYTES = 180 * 1024;
EMU_HD constexpr int stage_words(int nic_warps) {
  const int fit = STAGE_BUDGET_BYTES / 16 / (nic_warps < 1 ? 1 : nic_warps);
  return fit < STAGE_V ? fit : STAGE_V;
}
constexpr int CMSG = 14400;   // head stamp 16 + BF16 7168*2 + trailer 48
constexpr int MAX_TOPK = 8;
constexpr int NQ_MAX = 32;   // QPs allocated per rank (a call uses num_qps of them)
constexpr int STAMP_MAGIC = 0x5eed0000;

// ---- errors (first one wins, read by the host) ----------------------------
enum ErrCode : uint32_t {
  ERR_NONE = 0,
  ERR_TIMEOUT_RECV_COUNT = 1,   // dispatch receiver waited for a count flag
  ERR_TIMEOUT_RX_CQ = 2,        // write-imm receiver waited for receive completions
  ERR_TIMEOUT_COMB_FLAG = 3,    // combine receiver waited for a peer's flag
  ERR_TIMEOUT_CQ = 4,           // issuer waited for send completions (credit/flush)
  ERR_TIMEOUT_LOCK = 5,         // issuer waited for a shared QP's lock
  ERR_TIMEOUT_BARRIER = 6,      // blocks of one rank waited for each other
  ERR_TIMEOUT_NIC = 7,          // NIC agent never saw the EP blocks finish
  ERR_BAD_WQE = 8,              // NIC parsed a malformed/stale WQE (phase/meta/key)
  ERR_BAD_CQE = 9,              // issuer read a CQE with bad status
  ERR_TIMEOUT_WORLD = 10,       // cross-GPU start barrier
  ERR_NIC_TABLE = 11,           // NIC in-flight table overflow (should not happen)
  ERR_ABORTED = 12,             // stopped by the host (its bounded wait for the kernels ran out)
  ERR_TIMEOUT_TURN = 13,        // issuer waited for its doorbell turn on a shared QP
  ERR_TIMEOUT_PROXY = 14,       // issuer waited for proxy ring space / proxy completions
};
// err record: [0] code, [1] rank, [2] expert/qp, [3] counter seen, [4] expected, [5] aux,
// [6] block, [7] warp of the cooperative launch; block ~0: a host thread raised it (a proxy
// thread that read an error CQE, warp = its index; or the host's bounded wait)
constexpr int ERR_WORDS = 8;

// ---- stats (per GPU, u64) -------------------------------------------------
enum Stat : int {
  ST_STAMP_BAD_DISPATCH = 0,
  ST_STAMP_BAD_COMBINE = 1,
  ST_PACKETS = 2,
  ST_RETRANSMITS = 3,
  ST_WQES = 4,
  ST_DOORBELLS = 5,
  ST_FENCES = 6,
  ST_CQES = 7,
  ST_RX_CQES = 8,
  ST_LOCKS = 9,
  ST_CREDIT_POLLS = 10,
  ST_REORDERED = 11,   // packets landing before an earlier-posted packet of the same QP
  ST_TURN_WAITS = 12,  // doorbell turns that had to wait for an earlier slot's doorbell
  ST_DESCS = 13,       // proxy descriptors published
  ST_RING_FULL = 14,   // proxy: ring-space polls (host memory reads)
  ST_NIC_LATE_NS = 15, // sum over data packets of (delivered - due): the emulator falling behind its model
  ST_DROPS = 16,       // packet or ACK transmissions the wire dropped (each one resent or given up)
  ST_DUPS = 17,        // duplicate packets the receiver discarded (resent after a lost ACK)
  ST_ERR_CQES = 18,    // send CQEs written with an error status (retries exhausted)
  ST_NIC_EARLY_NS = 19,// sum over data packets of (due - delivered) when a packet landed early
  ST_LOCAL = 20,       // puts to the rank itself: copied by the issuing warp, never on the wire
  ST_MIRRORED = 21,    // WQEs the NIC copied from a host-memory SQ into its device mirror
  // where the lateness comes from, summed over data packets that landed:
  ST_NIC_CLAIM_LAG_NS = 22,  // claimed this long after it could be (due - deliver_lead_ns): warps busy
  ST_NIC_DELIVER_NS = 23,    // claim to visible: the batch's copies and fence
  // and what the delivery is made of, summed over data packets that landed (per batch, each
  // packet of it counted): the claim scan, the copies, the fence after them
  ST_NIC_SCAN_NS = 24,
  ST_NIC_COPY_NS = 25,
  ST_NIC_FENCE_NS = 26,
  // the NIC's host-facing engine (a NIC block's warp 0 when a queue is in host memory): its
  // doorbell-read passes, the QPs those passes found moved (one mirror copy each, whatever
  // the WQEs it carries), and its time: reading the doorbells, copying the moved QPs' WQEs,
  // passes that wrote CQEs (claim + writes), passes that found nothing to write
  ST_HOST_PASSES = 27,
  ST_HOST_QP_COPIES = 28,
  ST_HOST_READ_NS = 29,
  ST_HOST_COPY_NS = 30,
  ST_HOST_CQE_NS = 31,
  ST_HOST_IDLE_NS = 32,
  // the claim's first part, summed as the parts above (due mask and earliest due first): the
  // loads of the warp's share of the packet table and the due mask made of them; the rest of
  // ST_NIC_SCAN_NS is the claims (CAS rounds) and the release of entries beyond the batch
  ST_NIC_CLAIM_LOAD_NS = 33,
  ST_NUM = 34,
};

// Send CQE status the emulated NIC writes when a packet's retries run out (rdma-core
// efa_io_defs.h enum efa_io_comp_status: "unresponsive remote, detected locally").
constexpr uint8_t CQE_STATUS_UNRESP_REMOTE = 13;

// ---- profiler rows --------------------------------------------------------
// A row is 8 x u64. word0 = kind | op<<8 | rank<<16 | warp<<32.
enum ProfKind : uint32_t {
  PK_PUT = 1,        // one post group: t0 start, lock, credit, wqe, fence, doorbell, unlock(end)=w7 packs n
  PK_PHASE = 2,      // w1 = phase id, w2 = begin, w3 = end
  PK_PUT_PROXY = 3,  // proxy post group: w1 0, credit, descriptor stores, fence, ring-space wait, n, total
};
enum PhaseId : uint32_t {
  PH_LAYOUT = 1,     // count/slot computation (compute)
  PH_PACK = 2,       // token packing into the send buffer (compute)
  PH_FLUSH = 3,      // wait for all data completions before signalling (signal)
  PH_SIGNAL = 4,     // posting count/flag messages (signal)
  PH_POLL = 5,       // receiver waiting for flags / receive completions (poll_wait)
  PH_RECV = 6,       // receiver stamp checks and output (compute)
  PH_REDUCE = 7,     // combine reduction (compute)
  PH_DRAIN = 8,      // final completion drain (credit_wait: completion wait at the end)
  PH_BARRIER = 9,    // rank barrier (lock: waiting for other issuers)
};
constexpr int PROF_WORDS = 8;

// ---- run-time flags: every lever is one of these --------------------------
struct EpFlags {
  int lazy;             // skip per-put credit checks (this op)
  int credit_every;     // puts between two credit checks when not lazy
  int db_batch;         // B: WQEs per fence+doorbell
  int span;             // put_many: WQEs reserved and written per lock hold (>=1)
  int owned;            // each data QP driven by exactly one warp: no lock
  int notify_qp;        // QP 0 reserved for signals
  int num_qps;          // QPs used per call (incl. the notify QP when reserved)
  int agg;              // deferred doorbell aggregation threshold (0 = off)
  int imm_counting;     // write-with-immediate + receiver counts RX completions
  int ordered_unsafe;   // negative test: signal right after posting, no flush
  int batched_tail;     // provider batched tail: signals posted as one span, one doorbell
  int prof_period;      // sample one post group in N (0 = profiler off)
  int proxy;            // 1: warps hand descriptors to host proxy threads
  int cached;           // cached dispatch: reuse the layout handle, no count exchange
};

// ---- per-rank tables --------------------------------------------------------
struct RankPeer {  // addresses on rank r's GPU that remote NICs write to
  uint8_t* recv_x;              // [E_local][R][T][DMSG]
  unsigned long long* recv_cnt; // [E_local][R]
  uint8_t* comb_recv;           // [T][K][CMSG]
  unsigned long long* comb_flag;// [R]
  const lever_efa_nic_layout* rx; // [n_rxcq] its receive QPs (CQ fields; a copy on every GPU)
  unsigned int* rx_tail;        // [n_rxcq] (emulated NIC state: RX CQEs written)
};

struct QpIssuer {  // issuer-side QP state, shared by the warps posting on it; 128 B
  unsigned int resv;        // slots reserved (atomicAdd: the producer counter)
  unsigned int turn;        // slots whose doorbell turn has passed (slot order across CTAs)
  unsigned int db_last;     // producer value last written to the doorbell
  unsigned int cq_ci;       // CQEs consumed (CAS-advanced by any poller)
  unsigned int pad[28];
};
struct NicQp {  // NIC-side QP state; 128 B (per-WQE state lives in the NIC block's shared memory)
  unsigned int ci;          // WQEs consumed from the SQ
  unsigned int cq_pi;       // CQEs written
  unsigned int ci_sub[4];   // a NIC's blocks splitting its WQEs (Fabric::share_table 2, 3): block b
                            // takes the WQEs of index b mod blocks_per_nic, its next one at
                            // ci_sub[b] + b
  unsigned int pad[26];
};

struct ProxyDesc {  // 128 B descriptor of the proxy path (host ring entry)
  unsigned long long seq;     // 1-based sequence written last (valid marker)
  unsigned long long local_addr;
  unsigned long long remote_addr;
  unsigned int len;
  unsigned int imm;
  unsigned short dest_rank;
  unsigned short dest_qp;
  unsigned short has_imm;
  unsigned short qp;
  unsigned int pad[22];
};
static_assert(sizeof(ProxyDesc) == 128, "proxy descriptor 128 B");

struct RankLocal {
  int rank;
  const uint8_t* x_fp8;      // [T][H]
  const float* x_scales;     // [T][H/128]
  const int* topk;           // [T][K] global expert ids
  const float* topk_w;       // [T][K]
  uint8_t* send_buf;         // [T][DMSG]
  uint8_t* comb_send;        // [E_local][R*T][CMSG] (expert outputs at +16)
  unsigned long long* sig_src; // [E + R] sources of 8-byte signal writes
  int* slot_tab;             // [T][K]
  int* exp_count;            // [E] this rank's tokens per global expert
  int* out_src;              // [E_local][R][T]
  int* out_count;            // [E_local][R]
  uint16_t* comb_out;        // [T][H] bf16 bits
  unsigned int* rx_head;     // [n_rxcq] consumer indices
  QpIssuer* qps;             // [nq]
  const lever_efa_nic_layout* nic;  // [NQ_MAX] native send QPs: where SQ, doorbell and CQ are
  const lever_efa_nic_layout* rx;   // [n_rxcq] this rank's receive QPs (RX CQ of write-with-imm)
  NicQp* nicqp;              // [nq]
  int* hcount;               // [E_local][R] cached-dispatch handle: counts of the last full dispatch
  unsigned int* bar;         // [4] rank barrier counter
  unsigned long long* prof;  // [prof_cap][8]
  unsigned int* prof_n;      // [1]
  // proxy path (all pinned host memory, mapped into the GPU)
  ProxyDesc* pring;          // [nq][ring_depth] descriptor rings
  unsigned long long* pstate;// [nq][16]: [0] consumer index (descriptors taken), [8] completions seen
  const lever_efa_nic_layout* pnic;  // [NQ_MAX] the proxy's send QPs (pinned host memory; the
                                     // NIC mirrors their SQ over PCIe; null without a proxy)
  // what the NIC fetches from: a send QP whose SQ is in host memory is mirrored by the NIC
  // into device memory (its doorbell too); these are the mirrors' layouts, else the published
  const lever_efa_nic_layout* fnic;  // [NQ_MAX] native
  const lever_efa_nic_layout* fpnic; // [NQ_MAX] proxy (null without a proxy)
  unsigned* loc_cnt;         // [n_rxcq] write-imm puts the rank copied to itself this op
  unsigned* wqe_done;        // [NQ_MAX][sq_depth] V2: send completions per SQ slot, counted by
                             // whoever consumes the CQE (null for V1: nothing counted)
  uint8_t* nic_inl;          // [nics_per_rank x blocks_per_nic][512][128] the NIC's copies of
                             // inline WQE payloads, per NIC block and in-flight WQE slot
  unsigned long long* nic_wire;  // [nics_per_rank][4] a NIC's wire shared by its blocks
                                 // (blocks_per_nic > 1): [0] when the line is free, [1] the last
                                 // WQE's start, [2] the lock of the two; null with one block a NIC
};

struct Fabric {  // [platform.fabric] + [platform.nic] + [platform.receiver], ns
  int paths;
  int jitter_kind;  // 0 none, 1 exponential, 2 lognormal, 3 gamma
  float base_ns, spread_ns, jitter_mean_ns, jitter_sigma;
  float loss_prob, rto_ns;
  float line_rate_gbps;
  int mtu;
  float wqe_process_ns, dma_read_ns, completion_ns, min_wqe_gap_ns;
  float recv_completion_ns;
  int nics_per_rank;
  int max_retries;        // retransmissions of one packet before its WQE completes in error
  float deliver_lead_ns;  // a packet's copy starts this long before it is due (lands on time)
  int deliver_batch;      // due packets a NIC warp claims, copies and fences at once
  int dedicated_fetcher;  // 1: one NIC warp only fetches WQEs, the others only deliver;
                          // 0: whichever warp wins a try-lock fetches between its deliveries
  int claim_mask;         // 1: a delivering warp loads its share of the packet table at once and
                          // claims from the due mask; 2: the same, earliest due first; 0: it
                          // scans the table 32 entries a step
  float mirror_poll_gap_ns;  // the host engine's pause after a pass that saw no new doorbell
                             // (0: it reads the host doorbells back to back)
  int part_timers;        // 1: a delivering warp times its batch's claim, copies and fence
                          // (three %globaltimer reads a batch); 0: it does not
  int copy_staged;        // 1: a delivering warp stages its batch's packets in shared memory
                          // (cp.async, all loads in flight at once), then stores them; 2: the
                          // same through the copy engine (TMA bulk copies, one lane issuing);
                          // 0: one packet after another from registers
  int blocks_per_nic;     // NIC blocks (SMs) serving one emulated NIC: its QPs split between
                          // them, one wire (line rate, message rate) shared in global memory
  int share_table;        // with blocks_per_nic > 1: 1 the NIC's tables in its first block's shared
                          // memory, the other blocks of its cluster deliver from them; 0 its QPs
                          // split between the blocks, each with its own tables, one wire; 2 its
                          // WQEs split so (WQE i to block i mod blocks_per_nic), one wire; 3 its
                          // WQEs split, each block on a lane of the wire of its own
  int own_kernel;         // 1: the NIC blocks run as a kernel of their own beside the EP blocks'
                          // (up to MAXNW warps a block, 128 registers a thread); 0: one kernel
                          // holds both roles (up to 8 warps a block, 255 registers)
  int fence_release;      // 1: the fence after a batch's copies is a release fence (fence.acq_rel,
                          // store-store order is all the completions need); 0: fence.sc
                          // (__threadfence / __threadfence_system)
  int claim_loads;        // with claim_mask: 1 a lane reads a run of 16 packet-table entries as
                          // 16-byte volatile vectors (16 loads), all issued before any is
                          // tested; 0 every 32nd entry, 48 volatile loads, each tested in turn
  unsigned long long seed;
};

struct World {
  int num_ranks, ranks_per_gpu, gpu, num_gpus;
  int T, H, K, E, E_local;
  int sq_depth, rx_depth, n_rxcq, ring_depth;
  int ep_blocks_per_rank, ep_warps, nic_warps, nic_blocks;
  long long timeout_ns;
  RankLocal* local;      // [ranks_per_gpu] device
  RankPeer* peers;       // [num_ranks] device
  unsigned int* err;     // [ERR_WORDS]
  unsigned long long* stats;  // [ST_NUM]
  unsigned int* ep_done; // [1]
  unsigned long long* wbar;   // [num_gpus] world barrier words (this GPU's copy)
  unsigned long long** wbar_peers; // [num_gpus] pointers to every GPU's wbar
  int prof_cap;
  Fabric fab;
};

}  // namespace emu

// Host entry points (implemented in ep_kernels.cu, called by binding.cpp).
namespace emu_host {
int coop_max_blocks(int device, int threads, int smem);
int launch_world_barrier(const emu::World& w, unsigned long long seq, void* stream);
int launch_op(const emu::World& w, int op, unsigned int epoch, const emu::EpFlags& f, void* stream);
std::pair<int, int> nic_max_blocks(int device, int threads, int smem);
int enable_peer(int dev, int peer);
}

// Whether one rank's NIC tables can drive the EP kernels: 0 when they can, else
// non-zero with a one-line reason in err. Whoever filled them (the emulated NIC,
// hw/ep/emu_nic.h, or a real device's queue queries, hw/efa) passes through here:
// send[nq] are the rank's send QPs, recv[n_rx] its receive QPs, peers the host copy
// of the peer table the send layouts point to ([num_ranks][n_rx]: AH, QPN, keys of
// every destination queue). Host code, no CUDA calls (tests run it without a GPU).
extern "C" int lever_ep_check_nic(const lever_efa_nic_layout* send, int nq,
                                  const lever_efa_nic_layout* recv, int n_rx,
                                  const lever_efa_peer* peers, int num_peers, int num_ranks,
                                  char* err, size_t err_len);
// The same for a rank whose send QPs live on several EFA devices (rails): an AH belongs
// to a device's PD and an lkey to its MR, so each device has its own peer table. peers
// holds ntables tables of num_peers entries ([table][rank][receive queue]), tables_dev
// where each table's device copy is; send QP q belongs to table table_of[q] and its
// layout must point at that table's copy (the kernels index whatever their layout points
// at and know nothing of devices). Every send QP must pass lever_ep_check_nic's send
// checks, every table its peer checks; one table, every table_of 0: lever_ep_check_nic.
extern "C" int lever_ep_check_nic_rails(const lever_efa_nic_layout* send, int nq, const int* table_of,
                                        const uint64_t* tables_dev, int ntables,
                                        const lever_efa_nic_layout* recv, int n_rx,
                                        const lever_efa_peer* peers, int num_peers, int num_ranks,
                                        char* err, size_t err_len);

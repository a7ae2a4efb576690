// Thin Python binding of the emulated-NIC EP kernels: builds the per-GPU
// World (rank tables with raw device addresses that Python allocated through
// torch) and launches the world barrier and the ops on a given stream.
// Why raw addresses: neither this file nor the .cu needs torch headers (pybind11
// only, so it compiles fast and CI can check it); torch allocates the buffers.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <cuda_runtime.h>

#include <map>
#include <string>
#include <vector>

#include "efa_emu.cuh"

namespace py = pybind11;
using IntMap = std::map<std::string, int64_t>;
using FloatMap = std::map<std::string, double>;

static std::vector<emu::World> g_worlds;

static int64_t need(const IntMap& m, const char* k) {
  auto it = m.find(k);
  if (it == m.end()) throw std::runtime_error(std::string("missing key: ") + k);
  return it->second;
}
template <class T>
static T* ptr(const IntMap& m, const char* k) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(need(m, k)));
}

static int make_world(int gpu, const IntMap& c, const FloatMap& fab, const std::vector<IntMap>& locals,
                      const std::vector<IntMap>& peers, const std::vector<int64_t>& wbar_peers) {
  emu::World w{};
  w.gpu = gpu;
  w.num_ranks = (int)need(c, "num_ranks");
  w.ranks_per_gpu = (int)need(c, "ranks_per_gpu");
  w.num_gpus = (int)need(c, "num_gpus");
  w.T = (int)need(c, "T"); w.H = (int)need(c, "H"); w.K = (int)need(c, "K");
  w.E = (int)need(c, "E"); w.E_local = (int)need(c, "E_local");
  w.sq_depth = (int)need(c, "sq_depth"); w.rx_depth = (int)need(c, "rx_depth");
  w.n_rxcq = (int)need(c, "n_rxcq"); w.ring_depth = (int)need(c, "ring_depth");
  w.ep_blocks_per_rank = (int)need(c, "ep_blocks_per_rank");
  w.ep_warps = (int)need(c, "ep_warps"); w.nic_warps = (int)need(c, "nic_warps");
  w.nic_blocks = (int)need(c, "nic_blocks");
  w.timeout_ns = need(c, "timeout_ns");
  w.prof_cap = (int)need(c, "prof_cap");
  w.err = ptr<unsigned>(c, "err");
  w.stats = ptr<unsigned long long>(c, "stats");
  w.ep_done = ptr<unsigned>(c, "ep_done");
  w.wbar = ptr<unsigned long long>(c, "wbar");
  auto f = [&](const char* k) { auto it = fab.find(k); if (it == fab.end()) throw std::runtime_error(std::string("missing fabric key: ") + k); return it->second; };
  w.fab.paths = (int)f("paths"); w.fab.jitter_kind = (int)f("jitter_kind");
  w.fab.base_ns = (float)f("base_ns"); w.fab.spread_ns = (float)f("spread_ns");
  w.fab.jitter_mean_ns = (float)f("jitter_mean_ns"); w.fab.jitter_sigma = (float)f("jitter_sigma");
  w.fab.loss_prob = (float)f("loss_prob"); w.fab.rto_ns = (float)f("rto_ns");
  w.fab.line_rate_gbps = (float)f("line_rate_gbps"); w.fab.mtu = (int)f("mtu");
  w.fab.wqe_process_ns = (float)f("wqe_process_ns"); w.fab.dma_read_ns = (float)f("dma_read_ns");
  w.fab.completion_ns = (float)f("completion_ns"); w.fab.min_wqe_gap_ns = (float)f("min_wqe_gap_ns");
  w.fab.recv_completion_ns = (float)f("recv_completion_ns");
  w.fab.nics_per_rank = (int)f("nics_per_rank");
  w.fab.seed = (unsigned long long)f("seed");

  std::vector<emu::RankLocal> L(locals.size());
  for (size_t i = 0; i < locals.size(); ++i) {
    const IntMap& m = locals[i];
    emu::RankLocal& r = L[i];
    r.rank = (int)need(m, "rank");
    r.x_fp8 = ptr<const uint8_t>(m, "x_fp8"); r.x_scales = ptr<const float>(m, "x_scales");
    r.topk = ptr<const int>(m, "topk"); r.topk_w = ptr<const float>(m, "topk_w");
    r.send_buf = ptr<uint8_t>(m, "send_buf"); r.comb_send = ptr<uint8_t>(m, "comb_send");
    r.sig_src = ptr<unsigned long long>(m, "sig_src"); r.slot_tab = ptr<int>(m, "slot_tab");
    r.exp_count = ptr<int>(m, "exp_count"); r.out_src = ptr<int>(m, "out_src");
    r.out_count = ptr<int>(m, "out_count"); r.comb_out = ptr<uint16_t>(m, "comb_out");
    r.rx_head = ptr<unsigned>(m, "rx_head"); r.qps = ptr<emu::QpIssuer>(m, "qps");
    r.sq = ptr<emu::efa_io_tx_wqe>(m, "sq"); r.cq = ptr<emu::efa_io_tx_cdesc>(m, "cq");
    r.db = ptr<unsigned>(m, "db"); r.nicqp = ptr<emu::NicQp>(m, "nicqp");
    r.nic_rem = ptr<unsigned char>(m, "nic_rem"); r.bar = ptr<unsigned>(m, "bar");
    r.prof = ptr<unsigned long long>(m, "prof"); r.prof_n = ptr<unsigned>(m, "prof_n");
    r.pring = ptr<emu::ProxyDesc>(m, "pring"); r.pprod = ptr<unsigned long long>(m, "pprod");
    r.pdone = ptr<unsigned long long>(m, "pdone");
  }
  std::vector<emu::RankPeer> P(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) {
    const IntMap& m = peers[i];
    P[i].recv_x = ptr<uint8_t>(m, "recv_x"); P[i].recv_cnt = ptr<unsigned long long>(m, "recv_cnt");
    P[i].comb_recv = ptr<uint8_t>(m, "comb_recv");
    P[i].comb_flag = ptr<unsigned long long>(m, "comb_flag");
    P[i].rxcq = ptr<emu::efa_io_rx_cdesc>(m, "rxcq"); P[i].rx_tail = ptr<unsigned>(m, "rx_tail");
  }
  cudaSetDevice(gpu);
  void *dl = nullptr, *dp = nullptr, *dw = nullptr;
  if (cudaMalloc(&dl, sizeof(emu::RankLocal) * L.size()) != cudaSuccess ||
      cudaMalloc(&dp, sizeof(emu::RankPeer) * P.size()) != cudaSuccess ||
      cudaMalloc(&dw, sizeof(void*) * wbar_peers.size()) != cudaSuccess)
    throw std::runtime_error("cudaMalloc of the rank tables failed");
  cudaMemcpy(dl, L.data(), sizeof(emu::RankLocal) * L.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dp, P.data(), sizeof(emu::RankPeer) * P.size(), cudaMemcpyHostToDevice);
  std::vector<unsigned long long*> wp;
  for (auto v : wbar_peers) wp.push_back(reinterpret_cast<unsigned long long*>(static_cast<uintptr_t>(v)));
  cudaMemcpy(dw, wp.data(), sizeof(void*) * wp.size(), cudaMemcpyHostToDevice);
  w.local = static_cast<emu::RankLocal*>(dl);
  w.peers = static_cast<emu::RankPeer*>(dp);
  w.wbar_peers = static_cast<unsigned long long**>(dw);
  g_worlds.push_back(w);
  return (int)g_worlds.size() - 1;
}

static emu::EpFlags to_flags(const IntMap& m) {
  emu::EpFlags f{};
  f.lazy = (int)need(m, "lazy"); f.credit_every = (int)need(m, "credit_every");
  f.db_batch = (int)need(m, "db_batch"); f.span = (int)need(m, "span");
  f.owned = (int)need(m, "owned"); f.notify_qp = (int)need(m, "notify_qp");
  f.num_qps = (int)need(m, "num_qps"); f.agg = (int)need(m, "agg");
  f.imm_counting = (int)need(m, "imm_counting"); f.ordered_unsafe = (int)need(m, "ordered_unsafe");
  f.batched_tail = (int)need(m, "batched_tail"); f.prof_period = (int)need(m, "prof_period");
  f.proxy = (int)need(m, "proxy");
  return f;
}

static int launch_barrier(int h, int64_t seq, int64_t stream) {
  const emu::World& w = g_worlds.at(h);
  cudaSetDevice(w.gpu);
  return emu_host::launch_world_barrier(w, (unsigned long long)seq, reinterpret_cast<void*>(stream));
}
static int launch_op(int h, int op, int64_t epoch, const IntMap& flags, int64_t stream) {
  const emu::World& w = g_worlds.at(h);
  cudaSetDevice(w.gpu);
  return emu_host::launch_op(w, op, (unsigned)epoch, to_flags(flags), reinterpret_cast<void*>(stream));
}
static std::map<std::string, int64_t> layout_sizes() {
  return {{"wqe", sizeof(emu::efa_io_tx_wqe)}, {"tx_cqe", sizeof(emu::efa_io_tx_cdesc)},
          {"rx_cqe", sizeof(emu::efa_io_rx_cdesc)}, {"qp_issuer", sizeof(emu::QpIssuer)},
          {"nic_qp", sizeof(emu::NicQp)}, {"proxy_desc", sizeof(emu::ProxyDesc)},
          {"dmsg", emu::DMSG}, {"cmsg", emu::CMSG}, {"err_words", emu::ERR_WORDS},
          {"stats", emu::ST_NUM}, {"prof_words", emu::PROF_WORDS}};
}
static std::string err_string(int e) { return cudaGetErrorString((cudaError_t)e); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("make_world", &make_world);
  m.def("launch_barrier", &launch_barrier);
  m.def("launch_op", &launch_op);
  m.def("enable_peer", &emu_host::enable_peer);
  m.def("coop_max_blocks", &emu_host::coop_max_blocks);
  m.def("layout_sizes", &layout_sizes);
  m.def("err_string", &err_string);
}

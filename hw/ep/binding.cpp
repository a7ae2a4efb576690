// Thin Python binding of the emulated-NIC EP kernels: builds the per-GPU
// World (rank tables with raw device addresses that Python allocated through
// torch) and launches the world barrier and the ops on a given stream.
// It is also the emulated NIC's host setup: it fills the NIC layouts of the
// queues the emulator serves (hw/ep/emu_nic.h) and passes them through
// lever_ep_check_nic, the same entry a real device's layouts go through.
// Why raw addresses: neither this file nor the .cu needs torch headers (pybind11
// only, so it compiles fast and CI can check it); torch allocates the buffers.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "efa_emu.cuh"
#include "proxy_host.h"

namespace py = pybind11;
using IntMap = std::map<std::string, int64_t>;
using FloatMap = std::map<std::string, double>;

static std::vector<emu::World> g_worlds;

// Host copies of what the emulated NIC published, for the proxy threads and for records.
struct HostNic {
  std::vector<lever_efa_nic_layout> send, psend;  // [NQ_MAX] per rank
  std::vector<lever_efa_nic_layout> fsend, fpsend;  // what the NIC fetches from (mirrors of host SQs)
  std::vector<int> table_of;  // [NQ_MAX]: the peer table (EFA device) of each send slot
  int gpu = 0;              // the GPU whose world holds the rank
  unsigned* err = nullptr;  // that world's error words (a host thread stops the run there)
};
static std::map<int, HostNic> g_host_nic;            // by rank
static std::vector<lever_efa_peer> g_host_peers;     // [tables][num_ranks][n_rxcq]
static int g_n_rx = 0;
static size_t g_n_peers = 0;                        // entries of one table: num_ranks x n_rxcq

static int64_t need(const IntMap& m, const char* k) {
  auto it = m.find(k);
  if (it == m.end()) throw std::runtime_error(std::string("missing key: ") + k);
  return it->second;
}
template <class T>
static T* ptr(const IntMap& m, const char* k) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(need(m, k)));
}
template <class T>
static T* opt_ptr(const IntMap& m, const char* k) {
  auto it = m.find(k);
  return it == m.end() ? nullptr : reinterpret_cast<T*>(static_cast<uintptr_t>(it->second));
}

static std::string table_bytes(const py::dict& t, const char* k) {
  if (!t.contains(k)) throw std::runtime_error(std::string("NIC tables: missing ") + k);
  return t[k].cast<std::string>();
}
// The peer tables: "peers" is one table (bytes) or one per EFA device of the rank (a list
// of bytes: an AH belongs to a device's PD, so each device has its own).
static std::vector<std::string> peer_tables_of(const py::dict& t) {
  if (!t.contains("peers")) throw std::runtime_error("NIC tables: missing peers");
  std::vector<std::string> out;
  if (py::isinstance<py::list>(t["peers"]))
    for (const py::handle& b : t["peers"].cast<py::list>()) out.push_back(b.cast<std::string>());
  else
    out.push_back(t["peers"].cast<std::string>());
  if (out.empty() || out.size() > (size_t)emu::NQ_MAX)
    throw std::runtime_error("NIC tables: peers: 1..32 peer tables (one per EFA device)");
  return out;
}
static std::vector<lever_efa_nic_layout> layouts_of(const py::bytes& b, int n, const char* what) {
  const std::string s = b;
  if (s.size() != (size_t)n * sizeof(lever_efa_nic_layout))
    throw std::runtime_error(std::string("NIC tables: ") + what + " needs " + std::to_string(n) + " layouts");
  std::vector<lever_efa_nic_layout> v((size_t)n);
  memcpy(v.data(), s.data(), s.size());
  return v;
}
template <class T>
static py::bytes as_bytes(const std::vector<T>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// The emulated NIC's host setup: the layouts of the queues it serves for the ranks of one
// GPU (send QPs, proxy QPs where the rank has proxy rings) and every rank's receive queues,
// and the peer table, as the bytes of lever_efa_nic_layout / lever_efa_peer arrays. That is
// the form make_world takes from any NIC: a real device's tables come from its queue
// queries (hw/efa/device.py pack_layout / pack_peers). The peers field is left 0: the
// binding points it at its device copy of the table.
static py::dict emulated_nic_tables(const IntMap& c, const std::vector<IntMap>& locals,
                                    const std::vector<IntMap>& peers) {
  const int R = (int)need(c, "num_ranks"), nrx = (int)need(c, "n_rxcq"), NQ = emu::NQ_MAX;
  const uint32_t depth = (uint32_t)need(c, "sq_depth"), rxd = (uint32_t)need(c, "rx_depth");
  if (const char* why = emu_nic::numbering_problem(R, NQ, nrx)) throw std::runtime_error(why);
  if ((int)peers.size() != R) throw std::runtime_error("peers: one entry per rank");
  std::vector<lever_efa_nic_layout> recv((size_t)R * nrx);
  std::vector<lever_efa_peer> table((size_t)R * nrx);
  // where the receive CQs (write-with-immediate completions) are: pinned host memory, polled
  // through PCIe as on p5/p5en, or GPU memory
  const bool rx_host = c.count("rx_host") && need(c, "rx_host") != 0;
  for (int r = 0; r < R; ++r) {
    const uint64_t rxcq = (uint64_t)need(peers[r], "rxcq");
    for (int i = 0; i < nrx; ++i) {
      recv[(size_t)r * nrx + i] = emu_nic::recv_qp_layout(
          r, emu_nic::rx_qpn(r, i, nrx), rxcq + (uint64_t)i * rxd * emu_nic::CQE_SIZE, rxd, rx_host);
      table[(size_t)r * nrx + i] = emu_nic::peer_entry(r, i, nrx);
    }
  }
  // where the native QPs' SQ (with its doorbell) and CQ are: device memory, or pinned host
  // memory (SQ and doorbell write-combined, as an LLQ BAR is mapped)
  const bool sq_host = need(c, "sq_host") != 0, cq_host = need(c, "cq_host") != 0;
  // the device generation it plays: 64-byte WQEs (v59), or 128-byte ones with inline writes
  // of up to inline_write bytes (v63); completion counters (after v64) in GPU memory, the
  // send QPs' credit read from them instead of the CQ
  const uint32_t wqe = c.count("wqe_size") ? (uint32_t)need(c, "wqe_size") : emu_nic::WQE_SIZE;
  const uint32_t inl = c.count("inline_write") ? (uint32_t)need(c, "inline_write") : 0u;
  const bool cntrs = c.count("counters") && need(c, "counters") != 0;
  if (wqe != 64u && wqe != LEVER_EFA_WQE_SIZE_128) throw std::runtime_error("wqe_size: 64 or 128");
  if (inl > (wqe == 64u ? 0u : LEVER_EFA_INLINE_WRITE_MAX_128))
    throw std::runtime_error("inline_write: 0 with 64-byte WQEs, at most 80 with 128-byte ones");
  py::list send, psend, fsend, fpsend;
  for (const IntMap& m : locals) {
    const int rank = (int)need(m, "rank");
    std::vector<lever_efa_nic_layout> sl, pl, fl, fpl;
    const uint64_t cntr = cntrs ? (uint64_t)need(m, "cntr") : 0u;  // [NQ][2] u64: count, errors
    for (int q = 0; q < NQ; ++q) {
      const uint64_t sq = (uint64_t)need(m, "sq") + (uint64_t)q * depth * wqe;
      const uint64_t db = (uint64_t)need(m, "db") + (uint64_t)q * 32 * 4;
      const uint64_t cq = (uint64_t)need(m, "cq") + (uint64_t)q * depth * emu_nic::CQE_SIZE;
      const uint64_t msq = (uint64_t)need(m, "msq") + (uint64_t)q * depth * wqe;
      const uint64_t mdb = (uint64_t)need(m, "mdb") + (uint64_t)q * 32 * 4;
      sl.push_back(emu_nic::send_qp_layout_at(rank, emu_nic::SQ_QPN_BASE + (uint32_t)(rank * NQ + q), sq, db,
                                              cq, depth, depth, sq_host, cq_host, 0, (uint32_t)(R * nrx)));
      emu_nic::set_generation(sl.back(), wqe, inl, cntrs ? cntr + (uint64_t)q * 16u : 0u);
      fl.push_back(sq_host ? emu_nic::mirror_layout(sl.back(), msq, mdb) : sl.back());
      if (opt_ptr<void>(m, "psq")) {  // the proxy's host threads poll the CQ: no counters there
        const uint64_t psq = (uint64_t)need(m, "psq") + (uint64_t)q * depth * wqe;
        const uint64_t pdb = (uint64_t)need(m, "pdb") + (uint64_t)q * 32 * 4;
        const uint64_t pcq = (uint64_t)need(m, "pcq") + (uint64_t)q * depth * emu_nic::CQE_SIZE;
        const uint64_t pmsq = (uint64_t)need(m, "pmsq") + (uint64_t)q * depth * wqe;
        const uint64_t pmdb = (uint64_t)need(m, "pmdb") + (uint64_t)q * 32 * 4;
        pl.push_back(emu_nic::send_qp_layout(rank, emu_nic::PSQ_QPN_BASE + (uint32_t)(rank * NQ + q), psq,
                                             pdb, pcq, depth, depth, true, 0, (uint32_t)(R * nrx)));
        emu_nic::set_generation(pl.back(), wqe, 0u, 0u);
        fpl.push_back(emu_nic::mirror_layout(pl.back(), pmsq, pmdb));  // the proxy's SQ is host memory
      }
    }
    send.append(as_bytes(sl));
    psend.append(as_bytes(pl));
    fsend.append(as_bytes(fl));
    fpsend.append(as_bytes(fpl));
  }
  py::dict out;
  out["recv"] = as_bytes(recv);
  out["peers"] = as_bytes(table);
  out["send"] = send;
  out["psend"] = psend;
  out["fsend"] = fsend;
  out["fpsend"] = fpsend;
  return out;
}

static int make_world(int gpu, const IntMap& c, const FloatMap& fab, const std::vector<IntMap>& locals,
                      const std::vector<IntMap>& peers, const std::vector<int64_t>& wbar_peers,
                      const py::dict& tables) {
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
  w.fab.max_retries = (int)f("max_retries");
  w.fab.deliver_lead_ns = (float)f("deliver_lead_ns");
  w.fab.deliver_batch = (int)f("deliver_batch");
  w.fab.dedicated_fetcher = (int)f("dedicated_fetcher");
  w.fab.claim_mask = (int)f("claim_mask");
  w.fab.mirror_poll_gap_ns = (float)f("mirror_poll_gap_ns");
  w.fab.copy_staged = (int)f("copy_staged");
  w.fab.part_timers = (int)f("part_timers");
  w.fab.fence_release = (int)f("fence_release");
  w.fab.blocks_per_nic = (int)f("blocks_per_nic");
  w.fab.share_table = (int)f("share_table");
  w.fab.claim_loads = (int)f("claim_loads");
  w.fab.own_kernel = (int)f("own_kernel");
  w.fab.seed = (unsigned long long)f("seed");

  // ---- the NIC tables, whoever filled them (emulated_nic_tables below, or a real device's
  // queue queries): checked by the kernels' entry, then copied where the GPU reads them.
  const int R = w.num_ranks, nrx = w.n_rxcq, NQ = emu::NQ_MAX;
  if ((int)peers.size() != R) throw std::runtime_error("peers: one entry per rank");
  const size_t LS = sizeof(lever_efa_nic_layout);
  // "peers": one table, or one per EFA device with "send_table" (per local rank, per send
  // slot: which table its layout points at, i.e. the device its QP lives on; default 0)
  const std::string recv_b = table_bytes(tables, "recv");
  const std::vector<std::string> peer_tabs = peer_tables_of(tables);
  const int ntab = (int)peer_tabs.size();
  const size_t n_peers = (size_t)R * nrx;
  const py::list send_l = tables["send"].cast<py::list>(), psend_l = tables["psend"].cast<py::list>();
  const py::list fsend_l = tables.contains("fsend") ? tables["fsend"].cast<py::list>() : send_l;
  const py::list fpsend_l = tables.contains("fpsend") ? tables["fpsend"].cast<py::list>() : psend_l;
  bool peers_ok = true;
  for (const std::string& pt : peer_tabs) peers_ok = peers_ok && pt.size() == n_peers * sizeof(lever_efa_peer);
  if (recv_b.size() != (size_t)R * nrx * LS || !peers_ok || send_l.size() != locals.size() ||
      psend_l.size() != locals.size())
    throw std::runtime_error("NIC tables: need recv [ranks x n_rxcq] layouts, peers [ranks x n_rxcq] (each "
                             "table), send and psend per local rank");
  std::vector<std::vector<int>> table_of(locals.size(), std::vector<int>((size_t)NQ, 0));
  if (tables.contains("send_table")) {
    const py::list st = tables["send_table"].cast<py::list>();
    if (st.size() != locals.size()) throw std::runtime_error("NIC tables: send_table per local rank");
    for (size_t li = 0; li < locals.size(); ++li) {
      table_of[li] = st[li].cast<std::vector<int>>();
      if ((int)table_of[li].size() != NQ) throw std::runtime_error("NIC tables: send_table: one per send slot");
    }
  }
  if (ntab > 1 && w.nic_blocks > 0)
    throw std::runtime_error("NIC tables: the emulated NIC serves one peer table (one device per rank)");
  const size_t n_lay = (size_t)R * nrx + locals.size() * 4 * NQ;
  const size_t bytes = n_lay * LS + (size_t)ntab * n_peers * sizeof(lever_efa_peer);
  cudaSetDevice(gpu);
  void* dnic = nullptr;
  if (cudaMalloc(&dnic, bytes) != cudaSuccess) throw std::runtime_error("cudaMalloc of the NIC tables failed");
  auto* d_rx = static_cast<lever_efa_nic_layout*>(dnic);             // [R][nrx]
  auto* d_send = d_rx + (size_t)R * nrx;                               // [locals][NQ] native
  auto* d_psend = d_send + locals.size() * NQ;                         // [locals][NQ] proxy
  auto* d_fsend = d_psend + locals.size() * NQ;                        // [locals][NQ] native, NIC's view
  auto* d_fpsend = d_fsend + locals.size() * NQ;                       // [locals][NQ] proxy, NIC's view
  auto* d_peers = reinterpret_cast<lever_efa_peer*>(d_fpsend + locals.size() * NQ);
  std::vector<lever_efa_nic_layout> h_lay(n_lay);
  std::vector<lever_efa_peer> h_peers((size_t)ntab * n_peers);
  memcpy(h_lay.data(), recv_b.data(), recv_b.size());
  for (int t = 0; t < ntab; ++t)
    memcpy(h_peers.data() + (size_t)t * n_peers, peer_tabs[(size_t)t].data(), peer_tabs[(size_t)t].size());
  // the peer tables' device copies are the binding's: every send layout points to its own
  // device's (send_table), the kernels index whatever it points at
  std::vector<uint64_t> tables_dev((size_t)ntab);
  for (int t = 0; t < ntab; ++t) tables_dev[(size_t)t] = (uint64_t)(uintptr_t)(d_peers + (size_t)t * n_peers);
  for (size_t li = 0; li < locals.size(); ++li) {
    const int rank = (int)need(locals[li], "rank");
    HostNic& hn = g_host_nic[rank];
    hn.gpu = gpu;
    hn.err = w.err;
    hn.send = layouts_of(send_l[li].cast<py::bytes>(), NQ, "send");
    const std::string pb = psend_l[li].cast<py::bytes>();
    hn.psend = pb.empty() ? std::vector<lever_efa_nic_layout>{} : layouts_of(py::bytes(pb), NQ, "psend");
    hn.fsend = layouts_of(fsend_l[li].cast<py::bytes>(), NQ, "fsend");
    const std::string fpb = fpsend_l[li].cast<py::bytes>();
    hn.fpsend = fpb.empty() ? std::vector<lever_efa_nic_layout>{} : layouts_of(py::bytes(fpb), NQ, "fpsend");
    const bool proxy = !hn.psend.empty();
    if (proxy != !hn.fpsend.empty()) throw std::runtime_error("NIC tables: fpsend exactly when psend");
    if (proxy != (opt_ptr<void>(locals[li], "pring") != nullptr))
      throw std::runtime_error("NIC tables: proxy QP layouts exactly when the rank has proxy rings");
    hn.table_of = table_of[li];
    for (int q = 0; q < NQ; ++q) {
      const int t = hn.table_of[(size_t)q];
      if (t < 0 || t >= ntab) throw std::runtime_error("NIC tables: send_table names no peer table");
      const uint64_t peers_dev = tables_dev[(size_t)t];
      hn.send[q].peers = peers_dev;
      hn.fsend[q].peers = peers_dev;
      h_lay[(size_t)R * nrx + li * NQ + q] = hn.send[q];
      h_lay[(size_t)R * nrx + (2 * locals.size() + li) * NQ + q] = hn.fsend[q];
      if (proxy) {
        hn.psend[q].peers = peers_dev;
        hn.fpsend[q].peers = peers_dev;
        h_lay[(size_t)R * nrx + (locals.size() + li) * NQ + q] = hn.psend[q];
        h_lay[(size_t)R * nrx + (3 * locals.size() + li) * NQ + q] = hn.fpsend[q];
      }
    }
    char why[256];
    const lever_efa_nic_layout* rx = h_lay.data() + (size_t)rank * nrx;
    if (lever_ep_check_nic_rails(hn.send.data(), NQ, hn.table_of.data(), tables_dev.data(), ntab, rx, nrx,
                                 h_peers.data(), R * nrx, R, why, sizeof why))
      throw std::runtime_error(std::string("rank ") + std::to_string(rank) + " native NIC tables: " + why);
    if (proxy && lever_ep_check_nic_rails(hn.psend.data(), NQ, hn.table_of.data(), tables_dev.data(), ntab, rx,
                                          nrx, h_peers.data(), R * nrx, R, why, sizeof why))
      throw std::runtime_error(std::string("rank ") + std::to_string(rank) + " proxy NIC tables: " + why);
    // the emulated NIC's own tables (packet bookkeeping) are sq_depth deep
    if (w.nic_blocks > 0)
      for (int q = 0; q < NQ; ++q)
        if (hn.send[q].sq_num_entries != (uint32_t)w.sq_depth ||
            (proxy && hn.psend[q].sq_num_entries != (uint32_t)w.sq_depth))
          throw std::runtime_error("NIC tables: the emulated NIC serves SQs of sq_depth entries only");
  }
  g_host_peers = h_peers;
  g_n_rx = nrx;
  g_n_peers = n_peers;
  cudaMemcpy(dnic, h_lay.data(), n_lay * LS, cudaMemcpyHostToDevice);
  cudaMemcpy(d_peers, h_peers.data(), h_peers.size() * sizeof(lever_efa_peer), cudaMemcpyHostToDevice);

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
    r.nic = d_send + i * NQ;
    r.rx = d_rx + (size_t)r.rank * nrx;
    r.pnic = g_host_nic[r.rank].psend.empty() ? nullptr : d_psend + i * NQ;
    r.fnic = d_fsend + i * NQ;
    r.fpnic = g_host_nic[r.rank].fpsend.empty() ? nullptr : d_fpsend + i * NQ;
    r.loc_cnt = ptr<unsigned>(m, "loc_cnt");
    r.nicqp = ptr<emu::NicQp>(m, "nicqp");
    r.bar = ptr<unsigned>(m, "bar");
    r.hcount = ptr<int>(m, "hcount");
    r.prof = ptr<unsigned long long>(m, "prof"); r.prof_n = ptr<unsigned>(m, "prof_n");
    r.pring = opt_ptr<emu::ProxyDesc>(m, "pring"); r.pstate = opt_ptr<unsigned long long>(m, "pstate");
    r.nic_inl = opt_ptr<uint8_t>(m, "nic_inl");
    r.nic_wire = opt_ptr<unsigned long long>(m, "nic_wire");
    if (w.nic_blocks > 0 && w.fab.blocks_per_nic > 1 && !r.nic_wire)
      throw std::runtime_error("a NIC served by several blocks needs its nic_wire buffer");
    if (w.nic_blocks > 0 && !r.nic_inl)
      for (int q = 0; q < NQ; ++q)
        if (h_lay[(size_t)R * nrx + i * NQ + q].inline_write_size != 0u)
          throw std::runtime_error("inline writes on the emulated NIC need its nic_inl buffer");
  }
  std::vector<emu::RankPeer> P(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) {
    const IntMap& m = peers[i];
    P[i].recv_x = ptr<uint8_t>(m, "recv_x"); P[i].recv_cnt = ptr<unsigned long long>(m, "recv_cnt");
    P[i].comb_recv = ptr<uint8_t>(m, "comb_recv");
    P[i].comb_flag = ptr<unsigned long long>(m, "comb_flag");
    P[i].rx = d_rx + i * nrx; P[i].rx_tail = ptr<unsigned>(m, "rx_tail");
  }
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
  auto it = m.find("cached");
  f.cached = it == m.end() ? 0 : (int)it->second;
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
// The layout the emulated NIC published for one rank's QP (proxy: its proxy QP), for records.
static std::map<std::string, int64_t> nic_layout(int rank, int qp, bool proxy) {
  auto it = g_host_nic.find(rank);
  if (it == g_host_nic.end()) throw std::runtime_error("nic_layout: no world holds that rank");
  const auto& v = proxy ? it->second.psend : it->second.send;
  const lever_efa_nic_layout& l = v.at((size_t)qp);
  return {{"qp_num", l.qp_num}, {"sq_entry_size", l.sq_entry_size}, {"sq_num_entries", l.sq_num_entries},
          {"sq_max_batch", l.sq_max_batch}, {"sq_buffer_mem", l.sq_buffer_mem},
          {"sq_doorbell_mem", l.sq_doorbell_mem}, {"sq_phase_first", l.sq_phase_first},
          {"cq_entry_size", l.cq_entry_size}, {"cq_num_entries", l.cq_num_entries},
          {"cq_buffer_mem", l.cq_buffer_mem}, {"cq_phase_first", l.cq_phase_first},
          {"qkey", l.qkey}, {"lkey", l.lkey}, {"num_peers", l.num_peers}};
}
static std::map<std::string, int64_t> layout_sizes() {
  return {{"wqe", sizeof(emu::efa_io_tx_wqe)}, {"tx_cqe", sizeof(emu::efa_io_tx_cdesc)},
          {"rx_cqe", sizeof(emu::efa_io_rx_cdesc)}, {"cq_entry", emu_nic::CQE_SIZE},
          {"nic_layout", sizeof(lever_efa_nic_layout)}, {"qp_issuer", sizeof(emu::QpIssuer)},
          {"nic_qp", sizeof(emu::NicQp)}, {"proxy_desc", sizeof(emu::ProxyDesc)},
          {"dmsg", emu::DMSG}, {"cmsg", emu::CMSG}, {"err_words", emu::ERR_WORDS},
          {"stats", emu::ST_NUM}, {"prof_words", emu::PROF_WORDS},
          {"stage_bytes_per_warp", emu::STAGE_V * 16}};
}
// The staging slice of each delivering warp of a NIC block of `nic_warps` warps (bytes).
static int64_t stage_bytes(int nic_warps) { return (int64_t)emu::stage_words(nic_warps) * 16; }
static std::string err_string(int e) { return cudaGetErrorString((cudaError_t)e); }

// ------------------------------------------------------------------ proxy
// The CPU proxy: host threads poll the descriptor rings the GPU warps fill in
// pinned host memory, build the 64-byte EFA WQE for each descriptor in the
// proxy's send queue (pinned, write-combined: the emulated NIC mirrors it over
// PCIe), ring the doorbell once per drained batch, poll the proxy CQ the NIC writes,
// and write back the consumer index (ring space) and the completions counted, which
// the GPU polls. Descriptors are consumed strictly in ring order. The work of one
// pass is hw/ep/proxy_host.h (plain C++, driven without a GPU by the CPU tests); an
// error CQE stops the GPU's kernels through gpu_abort below.
// one ring with the sink that stops its rank's GPU
struct RingRun {
  proxy_host::Ring ring;
  proxy_host::Sink sink;
};
static std::vector<std::unique_ptr<RingRun>> g_rings;
static std::vector<std::thread> g_threads;
static std::atomic<int> g_stop{0};
static proxy_host::Stats g_pstats;

// Where a host thread stops a GPU's run: the world's error words, written from the host
// through a stream of its own (a copy engine runs beside the kernels).
struct GpuAbort {
  int gpu = 0;
  unsigned* err = nullptr;  // the world's err[ERR_WORDS] (device memory)
  cudaStream_t stream = nullptr;
  std::mutex m;
};
static std::map<int, std::unique_ptr<GpuAbort>> g_aborts;  // by GPU

// Write one error record into a GPU's error words unless the GPU (or another host thread)
// stopped the run already: words 1..7 first, the code last, so a kernel that sees the code
// finds the rest (what raise_err's first-error-wins CAS does on the device). The read and
// the write are two copies, so a device error raised between them is overwritten: the host's
// record names the earlier cause in the case this exists for (an error CQE, before any
// receiver's timeout). Returns whether it wrote.
static bool write_err_words(GpuAbort& a, const unsigned (&words)[emu::ERR_WORDS]) {
  std::lock_guard<std::mutex> g(a.m);
  cudaSetDevice(a.gpu);
  unsigned cur = 0;
  if (cudaMemcpyAsync(&cur, a.err, sizeof cur, cudaMemcpyDeviceToHost, a.stream) != cudaSuccess ||
      cudaStreamSynchronize(a.stream) != cudaSuccess || cur != 0u)
    return false;
  cudaMemcpyAsync(a.err + 1, words + 1, sizeof(unsigned) * (emu::ERR_WORDS - 1), cudaMemcpyHostToDevice,
                  a.stream);
  cudaMemcpyAsync(a.err, words, sizeof(unsigned), cudaMemcpyHostToDevice, a.stream);
  return cudaStreamSynchronize(a.stream) == cudaSuccess;
}
// The sink of the proxy threads: an error CQE stops the run as the native issuer's does
// (ERR_BAD_CQE with rank, QP, CQE index and status; block word ~0: a host thread, warp word:
// which one).
static void gpu_abort(void* ctx, const proxy_host::ErrorCqe& e) {
  const unsigned words[emu::ERR_WORDS] = {emu::ERR_BAD_CQE, (unsigned)e.rank, (unsigned)e.qp, (unsigned)e.ci,
                                          0u, e.status, 0xffffffffu, (unsigned)e.thread};
  write_err_words(*static_cast<GpuAbort*>(ctx), words);
}
static GpuAbort& abort_of(int gpu, unsigned* err) {
  auto& a = g_aborts[gpu];
  if (!a) {
    a = std::make_unique<GpuAbort>();
    a->gpu = gpu;
    cudaSetDevice(gpu);
    if (cudaStreamCreateWithFlags(&a->stream, cudaStreamNonBlocking) != cudaSuccess)
      throw std::runtime_error("cudaStreamCreateWithFlags failed");
  }
  a->err = err;
  return *a;
}
// The host's own stop of a world's run (its wait ran out): ERR_ABORTED, unless the run
// already stopped with an error of its own. Returns whether it wrote.
static bool abort_world(int h, int code) {
  const emu::World& w = g_worlds.at((size_t)h);
  const unsigned words[emu::ERR_WORDS] = {(unsigned)code, 0xffffffffu, 0u, 0u, 0u, 0u, 0xffffffffu, 0xffffffffu};
  return write_err_words(abort_of(w.gpu, w.err), words);
}

// A running world's error words and statistics, read from the host through a stream of its
// own while its kernels may still run (what a stuck run's report says).
static std::map<std::string, std::vector<int64_t>> peek_world(int h) {
  const emu::World& w = g_worlds.at((size_t)h);
  GpuAbort& a = abort_of(w.gpu, w.err);
  std::lock_guard<std::mutex> g(a.m);
  cudaSetDevice(w.gpu);
  unsigned err[emu::ERR_WORDS] = {};
  unsigned long long st[emu::ST_NUM] = {};
  cudaMemcpyAsync(err, w.err, sizeof err, cudaMemcpyDeviceToHost, a.stream);
  cudaMemcpyAsync(st, w.stats, sizeof st, cudaMemcpyDeviceToHost, a.stream);
  cudaStreamSynchronize(a.stream);
  return {{"err", std::vector<int64_t>(err, err + emu::ERR_WORDS)},
          {"stats", std::vector<int64_t>(st, st + emu::ST_NUM)}};
}

static void proxy_loop(std::vector<RingRun*> rings) {
  using clk = std::chrono::steady_clock;
  while (!g_stop.load(std::memory_order_relaxed)) {
    for (RingRun* r : rings) {
      const auto t0 = clk::now();
      const unsigned long long n = proxy_host::post(r->ring);
      if (n) {
        g_pstats.descs += n;
        g_pstats.batches += 1;
        g_pstats.post_ns += (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now() - t0).count();
      }
      const unsigned long long m = proxy_host::complete(r->ring, g_pstats, r->sink);
      if (m) g_pstats.cqes += m;
    }
  }
}

// Pinned host memory mapped into the GPU at the same address; write_combined for the
// queues an issuer only writes (SQ and doorbell: how an LLQ BAR is mapped).
static int64_t proxy_alloc(int64_t bytes, bool write_combined) {
  void* p = nullptr;
  unsigned fl = cudaHostAllocMapped | cudaHostAllocPortable;
  if (write_combined) fl |= cudaHostAllocWriteCombined;
  if (cudaHostAlloc(&p, (size_t)bytes, fl) != cudaSuccess)
    throw std::runtime_error("cudaHostAlloc failed");
  std::memset(p, 0, (size_t)bytes);
  void* dp = nullptr;
  if (cudaHostGetDevicePointer(&dp, p, 0) != cudaSuccess || dp != p)
    throw std::runtime_error("pinned host memory is not mapped at the same address (no UVA)");
  return (int64_t)(uintptr_t)p;
}
static void proxy_free(int64_t p) { cudaFreeHost(reinterpret_cast<void*>(static_cast<uintptr_t>(p))); }
static void host_zero(int64_t p, int64_t bytes) { std::memset(reinterpret_cast<void*>(static_cast<uintptr_t>(p)), 0, (size_t)bytes); }

static std::map<std::string, int64_t> proxy_stats() {
  std::map<std::string, int64_t> out = {{"descriptors", (int64_t)g_pstats.descs.load()},
                                        {"batches", (int64_t)g_pstats.batches.load()},
                                        {"post_ns", (int64_t)g_pstats.post_ns.load()},
                                        {"cqes", (int64_t)g_pstats.cqes.load()},
                                        {"bad_cqes", (int64_t)g_pstats.bad.load()},
                                        {"first_bad_status", (int64_t)g_pstats.first_bad_status.load() - 1},
                                        {"first_bad_rank", (int64_t)g_pstats.first_rank.load()},
                                        {"first_bad_qp", (int64_t)g_pstats.first_qp.load()},
                                        {"first_bad_cqe", (int64_t)g_pstats.first_ci.load()},
                                        {"first_bad_thread", (int64_t)g_pstats.first_thread.load()},
                                        {"threads", (int64_t)g_threads.size()}};
  return out;
}
static std::map<std::string, int64_t> proxy_stop() {
  auto out = proxy_stats();
  g_stop = 1;
  for (auto& t : g_threads) t.join();
  g_threads.clear();
  g_rings.clear();
  return out;
}

// ranks: per rank {rank, pring, pstate, psq, pcq, pdb}; the memory must be zeroed (fresh state)
static int proxy_start(const std::vector<IntMap>& ranks, int num_qps, int ring_depth, int sq_depth, int threads) {
  if (!g_threads.empty()) proxy_stop();
  g_stop = 0;
  g_pstats.reset();
  if (threads < 1) threads = 1;
  size_t i = 0;
  for (const IntMap& m : ranks) {
    auto* pring = ptr<emu::ProxyDesc>(m, "pring");
    auto* pstate = ptr<unsigned long long>(m, "pstate");
    const int rank = (int)need(m, "rank");
    auto it = g_host_nic.find(rank);
    if (it == g_host_nic.end() || (int)it->second.psend.size() < num_qps || !it->second.err)
      throw std::runtime_error("proxy_start: no proxy QP layouts for rank " + std::to_string(rank) +
                               " (make_world first, with psq/pcq/pdb)");
    GpuAbort& stop = abort_of(it->second.gpu, it->second.err);
    for (int q = 0; q < num_qps; ++q, ++i) {
      auto r = std::make_unique<RingRun>();
      proxy_host::Ring& g = r->ring;
      g.ring = pring + (size_t)q * ring_depth;
      g.cons = pstate + (size_t)q * 16;
      g.done = pstate + (size_t)q * 16 + 8;
      g.lay = it->second.psend[(size_t)q];
      g.peers = g_host_peers.data() + (size_t)it->second.table_of.at((size_t)q) * g_n_peers;  // its device's
      g.n_rx = g_n_rx;
      g.rank = rank;
      g.qp = q;
      g.ring_depth = ring_depth;
      g.sq_depth = sq_depth;
      g.thread = (int)(i % (size_t)threads);
      r->sink = proxy_host::Sink{gpu_abort, &stop};
      g_rings.push_back(std::move(r));
    }
  }
  std::vector<std::vector<RingRun*>> parts((size_t)threads);
  for (auto& r : g_rings) parts[(size_t)r->ring.thread].push_back(r.get());
  for (auto& p : parts)
    if (!p.empty()) g_threads.emplace_back(proxy_loop, p);
  return (int)g_threads.size();
}

#include "v2_binding.inc"  // DeepEP V2 worlds and launches
#include "ipc_binding.inc"  // CUDA IPC of the V2 buffers between a node's processes (V2 over EFA)

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  register_v2(m);
  register_ipc(m);
  m.def("proxy_alloc", &proxy_alloc, py::arg("bytes"), py::arg("write_combined") = false);
  m.def("proxy_free", &proxy_free);
  m.def("host_zero", &host_zero);
  m.def("proxy_start", &proxy_start);
  m.def("proxy_stop", &proxy_stop);
  m.def("proxy_stats", &proxy_stats);
  m.def("emulated_nic_tables", &emulated_nic_tables);
  m.def("make_world", &make_world);
  m.def("launch_barrier", &launch_barrier);
  m.def("launch_op", &launch_op);
  m.def("enable_peer", &emu_host::enable_peer);
  m.def("coop_max_blocks", &emu_host::coop_max_blocks);
  m.def("nic_max_blocks", &emu_host::nic_max_blocks);
  m.def("stage_bytes", &stage_bytes);
  m.def("layout_sizes", &layout_sizes);
  m.def("nic_layout", &nic_layout);
  m.def("err_string", &err_string);
  m.def("abort_world", &abort_world);
  m.def("peek_world", &peek_world);
}

// Thin Python binding of the primitive microbenchmarks. Only pybind11 (shipped with
// torch's headers) is included, not torch itself: the kernels need none of it, and the
// extension builds in seconds. The GIL is released while a family runs.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "prim.h"

namespace py = pybind11;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "GPU-initiated networking primitive microbenchmarks (hw/primitives)";
  auto g = py::call_guard<py::gil_scoped_release>();
  m.def("latency", &prim::run_latency, py::arg("device"), py::arg("reps"), g);
  m.def("stores_fences", &prim::run_stores_fences, py::arg("device"), py::arg("reps"), g);
  m.def("wqe_doorbell", &prim::run_wqe_doorbell, py::arg("device"), py::arg("reps"), g);
  m.def("cq_poll", &prim::run_cq_poll, py::arg("device"), py::arg("reps"), g);
  m.def("proxy_ring", &prim::run_proxy_ring, py::arg("device"), py::arg("reps"), g);
  m.def("shared_queue", &prim::run_shared_queue, py::arg("device"), py::arg("reps"), g);
  m.def("host_read", &prim::run_host_read, py::arg("device"), py::arg("reps"), g);
  m.def("fence_reads", &prim::run_fence_reads, py::arg("device"), py::arg("reps"), g);
  m.def("warp_copy", &prim::run_warp_copy, py::arg("device"), py::arg("reps"), g);
  m.def("turn_handoff", &prim::run_turn_handoff, py::arg("device"), py::arg("reps"), g);
  m.def("nvlink", &prim::run_nvlink, py::arg("device0"), py::arg("device1"), py::arg("reps"), g);
  m.def("cuda_versions", &prim::cuda_versions);
}

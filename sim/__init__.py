"""SimPy discrete-event model of GPU-initiated RDMA over EFA SRD (and RC for IB)."""

"""The path to a real EFA device: NIC layout for the kernels, host setup, discovery.

``nic_layout.h`` is what device code takes; ``host.cpp`` fills it with rdma-core v59;
``device.py`` discovers the device from Python (the ``efa`` package) and turns its
queue queries into the same layout; ``offsets_check.cpp`` proves the project's WQE/CQE
structs match the provider's. Nothing here needs an EFA device to import or test.
"""

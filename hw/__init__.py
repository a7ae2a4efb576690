"""Real CUDA kernels (native and proxy paths) and microbenchmarks, producing run records."""

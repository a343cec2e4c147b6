"""What gpu-check needs of the NVIDIA driver and nothing more: libcuda.py and ptx.py.

The driver API through ctypes on libcuda.so.1, and kernels as PTX text that the driver's JIT compiles.
No CUDA toolkit, no PyTorch, standard library only: it runs in any image a device plugin hands the driver's files to."""

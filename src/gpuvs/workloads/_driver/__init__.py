"""What gpu-check needs of the NVIDIA driver and nothing more: the driver API through ctypes on libcuda.so.1
(`libcuda.py`) and its kernels as PTX text that the driver's JIT compiles (`ptx.py`). No CUDA toolkit, no PyTorch:
standard library only, so that it runs in any image a device plugin hands the driver's files to."""

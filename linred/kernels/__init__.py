"""linred's own CUDA kernels, compiled at run time with NVRTC (through cuda.core).

The CUDA C++ source is ``segreduce.cuh``; :mod:`linred.kernels.compiler` turns a
template instantiation into a kernel, caching the compiled binary in memory and
on disk.
"""

# Sourced by the GPU scripts: puts libcublas.so.13 and libnccl.so.2 on the library path when the binary $BIN does not
# find them (it links cuBLAS dynamically and loads NCCL at run time; on the GPU machine both come with the CUDA toolkit
# or PyTorch's nvidia wheels).
if ! ldd "$BIN" | grep -q 'libcublas.so.13 => /'; then
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
             $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, d) for p in nvidia.__path__ for d in ("cu13/lib", "cublas/lib")))' 2>/dev/null); do
    if [ -e "$dir/libcublas.so.13" ]; then export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; break; fi
  done
fi
# libnccl.so.2, which the binary loads at run time for more than one GPU (docs/parallel.md): the toolkit's, else the
# nvidia-nccl wheel's that PyTorch uses.
if ! python3 -c 'import ctypes; ctypes.CDLL("libnccl.so.2")' 2>/dev/null; then
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
             $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, d) for p in nvidia.__path__ for d in ("cu13/lib", "nccl/lib")))' 2>/dev/null); do
    if [ -e "$dir/libnccl.so.2" ]; then export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; break; fi
  done
fi

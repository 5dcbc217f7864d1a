"""Every choice that depends on the machine: weight dtype and BLAS (``device``), the one-row
matmul shim (``blas_shim`` + ``sgemv_shim.c``), the compiled one-token rope, and logging setup.
Nothing outside this package decides anything per device."""

"""Every choice that depends on the machine: weight dtype and BLAS (``device``), the one-row
matmul shim (``blas_shim`` + ``sgemv_shim.c``), the compiled one-token rope, logging setup, and
``settings``: every ``MLXCEL_*`` environment switch, read once. Nothing outside this package decides
anything per device, or reads a switch itself."""

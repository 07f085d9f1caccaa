CUDA = False  # bench/warm_start.py writes its own copy: True where the .cu kernels are built

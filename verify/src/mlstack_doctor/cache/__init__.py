"""What the doctor keeps in the Triton cache folder, and how it checks what it finds there.

kernel_cache  Triton's and inductor's cache entries checked from disk, bad ones moved aside
              (<cache>/mlstack-quarantine/)
warm          the warm step's cache key and its stamp (<cache>/mlstack-warm/)
warm_share    a warmed key's cache as one artifact on the cluster's share, published and installed
config_stamp  a model config built once per set of files the worker reads (<cache>/mlstack-config/)

The probes (caches, warm, model) and the runtime's diagnosis read and write through these modules.
Standard library only.
"""

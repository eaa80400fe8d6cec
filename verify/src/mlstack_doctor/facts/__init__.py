"""Facts about the machine, each read by one parser: the NVIDIA driver a node states (nvidia), the libcuda
a system's linker finds (libcuda), the stack's packages (packages).

Standard library only, and no import of the rest of the doctor: the testbed imports these modules as they
are, and the collection carries verbatim copies in plugins/module_utils (nvidia_facts.py, libcuda_facts.py,
stack_packages.py; tests/unit/plugins/module_utils/test_vendored_facts.py keeps them identical). Each
parser takes text and returns what it says; running the command that prints the text is the caller's.
"""

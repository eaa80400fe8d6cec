"""mlstack-doctor: proves the GPU ML stack works, stage by stage, or names the root cause and the fix."""

__version__ = "0.1.0"
# 1.1: summary.root_causes; 1.2: fingerprint, reused; 1.3: root_causes[].consequences;
# 1.4: probes[].evidence.experiment (diagnosis by experiment), its codes
SCHEMA_VERSION = "1.4"

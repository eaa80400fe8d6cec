"""The tools that run around the doctor, not inside a check: its scheduled runs and their metrics.

schedule      `python -m mlstack_doctor.ops.schedule apply|remove SPEC`: the container's systemd timers,
              each running the monitor script (monitor.sh, written with its settings on top)
metrics       a run's Prometheus metrics for node_exporter's textfile collector (`mlstack-doctor
              --metrics FILE`), and `python -m mlstack_doctor.ops.metrics --run-skipped` for a run the
              monitor skipped
node_metrics  `python -m mlstack_doctor.ops.node_metrics` on the Proxmox VE node: every container's
              metrics in one file, run from the doctor's wheel by zip import

Standard library only, like the rest of the doctor; node_metrics imports no more than metrics and files,
so the node's own Python runs it.
"""

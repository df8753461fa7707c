"""The chapters ' labs: probes and demonstrations only chapters run (nothing here is product or harness)."""

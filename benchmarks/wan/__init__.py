"""The WAN lab (docs/reports/wan_lab.md): providers behind emulated links (`link`, `profiles`), a run and its figures
(`harness`, `report`), the compute emulation's validation (`validate`) and the proxy against tbf (`tbf_check`).
`python -m benchmarks.wan --help` runs it."""

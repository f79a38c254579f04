"""The profiler's analysis side: from probe samples (or what the machine reports) to a topology file.

Modules, in pipeline order:
- `samples`: the raw-samples file the probe binary (`profiler/taccl-probe`) writes; checking it.
- `fit`: robust `time = alpha + bytes/bw` fit with its error.
- `analyze`: link classes, switch vs. direct wiring, PCIe switch groups, NIC placement and nearest CPU.
- `nvsmi`, `nccl_xml`: the same facts from `nvidia-smi topo -m` and NCCL's topology XML.
- `renumber`: the GPU renumbering (NVLink-graph automorphism) that puts the NIC next to GPU 0.
- `writer`: `NodeFacts`, merging sources, and the topology document.
- `synth`: generated sample sets for tests; `runner`: drives the probe binary.
"""

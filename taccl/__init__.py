"""taccl: synthesize, verify, simulate and run collective-communication algorithms.

The pipeline, one module per stage (later stages import earlier data types, never the reverse):

    topology, sketch, collectives -> problem -> routing -> ordering -> contiguity -> algorithm
    algorithm -> lowering -> program (MSCCL XML) -> checker, simulator
"""

__version__ = "0.1.0"

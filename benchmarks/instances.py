"""The synthesis benchmark's instances (shared by benchmarks/synthesis.py and benchmarks/quality.py).

Each entry: (label, sketch file, collective override or None, size override or None, group, node count
override or None).
Groups: "core" (2-node and single-node), "scale" (64 and 128 GPUs), "stretch" (512 and 1024 GPUs), "node" (one
DGX H100 node; `quality.py --groups node`).
Reference model sizes (routing MILP variables / constraints / binaries) are the ones measured for the
reference TACCL implementation, from ../shared/data/taccl-examples/SOURCES.md.
"""
from pathlib import Path

SKETCHES = Path(__file__).resolve().parent.parent / "sketches"

INSTANCES = [
    ("2x DGX-2 AllGather sk-1 1MB", "dgx2-sk-1.json", None, None, "core", None),
    ("2x DGX-2 AllGather sk-2 1KB", "dgx2-sk-2.json", None, None, "core", None),
    ("2x NDv2 AllGather sk-1", "ndv2-sk-1.json", None, None, "core", None),
    ("2x NDv2 AllGather sk-2", "ndv2-sk-2.json", None, None, "core", None),
    ("2x NDv2 AllToAll sk-1", "ndv2-alltoall-sk-1.json", None, None, "core", None),
    ("4x NDv2 AllGather", "ndv2-n4.json", None, None, "core", None),
    ("2x DGX-2 AllToAll", "dgx2-alltoall.json", None, None, "core", None),
    ("2x NDv2 AllReduce", "ndv2-sk-1.json", "allreduce", None, "core", None),
    ("2x DGX-2 AllReduce", "dgx2-sk-1.json", "allreduce", None, "core", None),
    ("1x NDv2 AllGather", "ndv2-single.json", None, None, "core", None),
    ("1x NDv2 AllToAll", "ndv2-single.json", "alltoall", None, "core", None),
    ("2x DGX H100 AllGather hierarchical", "dgx-h100-hier.json", None, None, "core", None),
    ("2x DGX H100 AllReduce hierarchical", "dgx-h100-hier.json", "allreduce", None, "core", None),
    ("2x DGX A100 AllToAll hierarchical", "dgx-a100-hier.json", "alltoall", None, "core", None),
    ("2x DGX-2 AllReduce hierarchical", "dgx2-hier.json", "allreduce", None, "core", None),
    ("8x NDv2 AllGather (64 GPUs)", "ndv2-n8.json", None, None, "scale", None),
    ("16x DGX A100 AllGather (128 GPUs)", "dgx-a100-n16.json", None, None, "scale", None),
    ("16x DGX H100 AllGather hierarchical (128 GPUs)", "dgx-h100-hier.json", None, None, "scale", 16),
    ("16x DGX H100 ReduceScatter hierarchical (128 GPUs)", "dgx-h100-hier.json", "reducescatter", None, "scale",
     16),
    ("16x DGX H100 AllReduce hierarchical (128 GPUs)", "dgx-h100-hier.json", "allreduce", None, "scale", 16),
    ("16x DGX H100 AllToAll hierarchical (128 GPUs)", "dgx-h100-hier.json", "alltoall", None, "scale", 16),
    ("128x DGX H100 AllGather hierarchical 1 GB (1024 GPUs)", "dgx-h100-n128.json", None, None, "stretch", None),
    ("128x DGX H100 ReduceScatter hierarchical 1 GB (1024 GPUs)", "dgx-h100-n128.json", "reducescatter", None,
     "stretch", None),
    ("128x DGX H100 AllReduce hierarchical 1 GB (1024 GPUs)", "dgx-h100-n128.json", "allreduce", None, "stretch",
     None),
    ("64x DGX H100 AllToAll hierarchical 1 GiB (512 GPUs)", "dgx-h100-hier.json", "alltoall", "1G", "stretch", 64),
    # one DGX H100 node, which no shipped SKU has yet (`quality.py --groups node`): the flat one-hop sketch,
    # with the wider variants of NODE_H100 as companions
    ("1x DGX H100 AllGather", "dgx-h100-direct.json", None, None, "node", 1),
    ("1x DGX H100 ReduceScatter", "dgx-h100-direct.json", "reducescatter", None, "node", 1),
    ("1x DGX H100 AllReduce", "dgx-h100-direct.json", "allreduce", None, "node", 1),
    ("1x DGX H100 AllToAll", "dgx-h100-direct.json", "alltoall", None, "node", 1),
]

# Companions (benchmarks/quality.py): sketches for other message sizes that a user, and the SKU files in
# sketches/skus/, synthesize beside an instance's own for the same collective and nodes, each at its own input
# size: the one-shot AllReduce forms, the flat one-hop sketches and the flat rail-aligned one for the largest
# H100 messages. The instance's best synthesized program is the best over its sketch and these, as a batch's
# selection would pick it. A companion is a sketch file, synthesized in every protocol and instance count, or
# a dict naming the variants as a SKU candidate does: {"sketch", "at" (synthesis size), "chunkup",
# "protocols", "instances", "fusions" (lowering policies, one program each)}, each optional but the sketch.
# DGX-2's hierarchical phases (rail exchange through the NIC each GPU pair shares, NVSwitch inside) carry the
# large messages; they need chunks cut in two (AllReduce) or four (AllGather: the fan-out of remote blocks
# over NVSwitch overlaps the NIC only with finer chunks) and two thread blocks per connection. In LL,
# synthesized at 64 KiB, they also carry the small AllReduce messages.
DGX2_HIER_ALLGATHER = {"sketch": "dgx2-hier.json", "at": "16M", "chunkup": 4, "protocols": ["Simple"],
                       "instances": [2]}
# a few MiB: halved chunks on two blocks a connection, ordered for 1 MiB (4 MiB: 58.3 us against the LL128
# ring's 65.8). Instance counts are powers of two: on three, 192 chunks a loop divide no power-of-two size
DGX2_HIER_ALLGATHER_MID = {"sketch": "dgx2-hier.json", "at": "1M", "chunkup": 2, "protocols": ["Simple"],
                           "instances": [2, 4]}
# the one-hop sketch also routed for 16 KiB in LL, where part of each GPU's blocks cross to one GPU of the
# other node and go on from there (at 4 KiB every block goes straight to its destination): 16 KiB 9.46 us on
# four blocks a connection against 10.0 of the 4 KiB program and of the all-pairs baseline
DGX2_DIRECT_16K = {"sketch": "dgx2-direct.json", "at": "16K", "protocols": ["LL"]}
DGX2_HIER_ALLREDUCE = {"sketch": "dgx2-hier.json", "at": "16M", "chunkup": 2, "protocols": ["Simple"],
                       "instances": [2]}
# The H100 SKU's 16 MiB candidate: halved chunks on eight thread blocks per connection, whose per-step
# latencies overlap more than on four (AllGather at 16 MiB: 57.5 us).
H100_HIER_FINE = {"sketch": "dgx-h100-hier.json", "at": "16M", "chunkup": 2, "protocols": ["Simple"],
                  "instances": [8]}
# The H100 SKU's two-node candidate for the reductions at 16 MiB: chunks cut in four, on four thread blocks
# per connection (AllReduce at 16 MiB: 101.4 us against 103.3 of the halves)
H100_HIER_QUARTER = {"sketch": "dgx-h100-hier.json", "at": "16M", "chunkup": 4, "protocols": ["Simple"],
                     "instances": [4]}
# The H100 SKU's 16-node candidates for 16 MiB to 1 GiB: whole chunks ordered for 64 MiB, and for
# ReduceScatter the halved chunks on four blocks also lowered as the schedule says (each chunk split over the
# channels), which "auto", ranking at 16 MiB, passes over and which wins from 256 MiB
H100_HIER_64M = {"sketch": "dgx-h100-hier.json", "at": "64M", "protocols": ["Simple"], "instances": [4]}
H100_HIER_FINE_RS = {"sketch": "dgx-h100-hier.json", "at": "16M", "chunkup": 2, "protocols": ["Simple"],
                     "instances": [4], "fusions": ["auto", "schedule"]}
# One DGX H100 node: the one-hop sketch synthesized from 256 KiB to 64 MiB, in whole, halved and quartered
# chunks, on 4 and 8 blocks a connection (the 32-channel ring is the bar there from 1 MiB)
NODE_H100 = [{"sketch": "dgx-h100-direct.json", "at": at, "chunkup": cu, "instances": [4, 8]}
             for at in ("256K", "1M", "4M", "64M") for cu in (1, 2, 4)]
# and the rings for ReduceScatter, where partial sums that land aside cost a flag and a pass: NCCL's one-way
# ring in LL and LL128 on 32 blocks a connection (1 MiB: 14.41 us, the optimum; the one-hop sketch 16.2), both
# ways round in Simple (16 MiB: 58.5 us; 64 / 256 MiB: 178.4 / 650.1 against the ring's 184.4 / 691.5)
NODE_H100_RINGS = [{"sketch": "dgx-h100-ring.json", "at": "1M", "protocols": ["LL", "LL128"], "instances": [32]},
                   {"sketch": "dgx-h100-bidir-ring.json", "at": "1M", "protocols": ["Simple"], "instances": [16]},
                   {"sketch": "dgx-h100-bidir-ring.json", "at": "16M", "protocols": ["Simple"], "instances": [32]}]
COMPANIONS = {
    "2x DGX-2 AllGather sk-1 1MB": ["dgx2-direct.json", DGX2_DIRECT_16K, DGX2_HIER_ALLGATHER,
                                    DGX2_HIER_ALLGATHER_MID],
    "2x DGX-2 AllGather sk-2 1KB": ["dgx2-direct.json", DGX2_DIRECT_16K, DGX2_HIER_ALLGATHER,
                                    DGX2_HIER_ALLGATHER_MID],
    # the NDv2 SKU's AllReduce candidates for 8 KiB-8 MiB: the phases in LL / LL128 at 64 KiB (its 8 KiB -
    # 1 MiB winners), sk-1 in chunks cut in four (its 2-8 MiB winner)
    "2x NDv2 AllReduce": ["ndv2-hier-one-shot.json",
                          {"sketch": "ndv2-hier.json", "at": "64K", "protocols": ["LL", "LL128"],
                           "instances": [1, 2]},
                          {"sketch": "ndv2-sk-1.json", "at": "8M", "chunkup": 4, "protocols": ["LL128"],
                           "instances": [4]}],
    "2x DGX-2 AllReduce": ["dgx2-direct.json", {"sketch": "dgx2-hier.json", "at": "64K", "protocols": ["LL"],
                                                 "instances": [1]}, DGX2_HIER_ALLREDUCE],
    "2x DGX-2 AllReduce hierarchical": ["dgx2-direct.json", DGX2_HIER_ALLREDUCE],
    "2x DGX H100 AllGather hierarchical": ["dgx-h100-direct.json", "dgx-h100-rail.json", H100_HIER_FINE],
    "2x DGX H100 AllReduce hierarchical": ["dgx-h100-one-shot.json", "dgx-h100-hier-one-shot.json",
                                           "dgx-h100-direct.json", "dgx-h100-rail.json", H100_HIER_FINE,
                                           H100_HIER_QUARTER],
    "2x DGX A100 AllToAll hierarchical": ["dgx-a100-direct.json"],
    "2x NDv2 AllToAll sk-1": ["ndv2-sk-2.json"],
    # the NDv2 SKU synthesizes both of TACCL's sketches for AllGather (64 KiB: sk-2 19.0 us, the LL ring
    # 24.2)
    "2x NDv2 AllGather sk-1": ["ndv2-sk-2.json"],
    "2x DGX-2 AllToAll": ["dgx2-direct.json"],
    # halved chunks, synthesized for 256 KiB and 1 MiB on four and eight thread blocks a connection: the
    # second hop of a relayed block overlaps the first hop of the other half, as the mesh baseline's four
    # rings on eight channels each overlap theirs (1 MiB: LL128 25.7 us against the ring's 29.3; 4 MiB:
    # Simple 54.9 against 62.8; whole chunks: 28.9 and 63.4)
    "1x NDv2 AllGather": [{"sketch": "ndv2-single.json", "at": at, "chunkup": 2, "instances": [4, 8]}
                          for at in ("256K", "1M")],
    # halved chunks on eight thread blocks a connection: a relayed block's two Simple steps overlap more
    # (16 MiB: 296.5 us against 314.0 on four)
    "1x NDv2 AllToAll": [{"sketch": "ndv2-single.json", "at": "16M", "chunkup": 2, "protocols": ["Simple"],
                          "instances": [8]},
                         # and at 1 MiB, where two blocks a connection let the schedule's fusion win (Simple on
                         # eight instances: 35.2 us; 36.6 on four)
                         {"sketch": "ndv2-single.json", "at": "1M", "protocols": ["Simple"], "instances": [8]}],
    # the A100 SKU's 16-node AllGather candidates: the hierarchical phases (every protocol, 1 and 4 blocks),
    # halved chunks in LL128 at 16 MiB and in Simple at 1 GiB, whole chunks in Simple at 64 MiB
    "16x DGX A100 AllGather (128 GPUs)": [
        {"sketch": "dgx-a100-hier.json", "at": "16M"},
        {"sketch": "dgx-a100-hier.json", "at": "16M", "chunkup": 2, "protocols": ["LL128"], "instances": [4]},
        {"sketch": "dgx-a100-hier.json", "at": "1G", "chunkup": 2, "protocols": ["Simple"], "instances": [4]},
        {"sketch": "dgx-a100-hier.json", "at": "64M", "protocols": ["Simple"], "instances": [4]}],
    "16x DGX H100 AllGather hierarchical (128 GPUs)": [H100_HIER_64M],
    "16x DGX H100 ReduceScatter hierarchical (128 GPUs)": [H100_HIER_64M, H100_HIER_FINE_RS],
    "16x DGX H100 AllReduce hierarchical (128 GPUs)": [H100_HIER_64M],
    "1x DGX H100 AllGather": NODE_H100,
    "1x DGX H100 ReduceScatter": NODE_H100 + NODE_H100_RINGS,
    # and the one-shot form for the smallest messages
    "1x DGX H100 AllReduce": NODE_H100 + [{"sketch": "dgx-h100-one-shot.json", "at": at, "protocols": ["LL", "LL128"],
                                            "instances": [1, 4, 8]} for at in ("4K", "16K")],
    "1x DGX H100 AllToAll": NODE_H100,
}

REFERENCE_ROUTING_SIZE = {
    "2x DGX-2 AllGather sk-1 1MB": (133_377, 258_689, 65_792),
    "2x NDv2 AllToAll sk-1": (135_169, 219_213, 65_536),
    "2x DGX-2 AllToAll": (2_130_177, 4_923_537, 1_048_832),
}

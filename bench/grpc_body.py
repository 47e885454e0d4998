#!/usr/bin/env python3
"""Writes one gRPC-framed ModelInferRequest (1 row of the reference samples) for
h2load: `grpc_body.py <samples.csv> <model> <out>`."""
import struct
import sys

import numpy as np
from tritonclient.grpc import service_pb2

samples, model, out = sys.argv[1:4]
x = np.loadtxt(samples, delimiter=",", skiprows=1, max_rows=1, dtype=np.float64)[1:33].astype("<f4")
req = service_pb2.ModelInferRequest(model_name=model)
t = req.inputs.add()
t.name, t.datatype = "input", "FP32"
t.shape.extend([1, 32])
req.raw_input_contents.append(x.tobytes())
msg = req.SerializeToString()
open(out, "wb").write(b"\x00" + struct.pack(">I", len(msg)) + msg)

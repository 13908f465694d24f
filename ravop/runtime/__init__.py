"""Running recorded ops: the one runner (`Runner`), loops as run (`LoopRun`), the step compiler and CUDA graph
capture, and in-process evaluation. What a worker runs; it records nothing and reads no store."""

"""The supervisor: fail an inference service over to its CPU variant after consecutive
failed cycles, and back once the GPU has been healthy long enough."""

"""The prover's simulation: the recorder that writes a transcript and the simulated chips that log signed snapshots."""

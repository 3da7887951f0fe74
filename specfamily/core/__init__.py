"""The engine: verifier math, target wrapper, decode loop. Knows no drafter by name."""

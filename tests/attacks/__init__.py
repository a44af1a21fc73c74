"""Adversarial D-versus-D′ corpus for DESIGN.md privacy invariant 7 (side channels)."""

"""GQA conversion: fewer key/value heads by a calibrated, RoPE-exact merge, then a short KL recovery (docs/GQA.md)."""

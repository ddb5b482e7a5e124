"""The review bundle: PR.md and EVIDENCE.md, schemas, the GitHub form (floor 4)."""

"""The kinds of batch, a module each (rows, windows, L5Kit samples, sequences, LeRobot's items): a parent-side
description (a `source.BatchSource`) and a worker-side builder, and the public loader that makes them
(docs/architecture.md, "Adding a kind of batch")."""

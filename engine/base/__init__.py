"""What every other folder of the engine builds on: its settings, the model's shape and its
errors. It imports nothing else of the engine."""

"""Built-in backends, one module each. Imported lazily: each needs only its own extra."""

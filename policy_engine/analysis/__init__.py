"""The exact policy engine: automata over rule dimensions, diff, witnesses and properties."""

"""What every sandbox backend must hide from a process, computed the same way for each of them."""

"""The one call path: the communicator, its argument checks, books, work and deadline, and the backend protocol."""

"""What keeps ranks safe: check mode and its guard, the progress board, the arrival handshake, the exit, abort and fork hooks."""

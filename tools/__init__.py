"""Commands run around the stack: review, hand-off, plan, verify, bench, benchmark."""

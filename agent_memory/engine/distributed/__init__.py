"""One model over several processes: rank 0 decides every step, the others follow its plan."""

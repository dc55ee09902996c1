"""What the Circle model holds: the qparams torch applied, the ones tico's passes left, the torch copy
that quantizes as Circle does, and the missing-qparam audit."""

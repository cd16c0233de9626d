"""PermFlow: permutation flow matching on the Birkhoff affine subspace."""

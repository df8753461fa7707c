"""The front ends: `qtts say`, `qtts serve`, and the options they share."""

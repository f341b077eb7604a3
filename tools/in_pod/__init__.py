"""Code that runs inside a deployed pod, sent there by a tool as text (verify's image probe): standard
library only, since the pod has none of this repository."""

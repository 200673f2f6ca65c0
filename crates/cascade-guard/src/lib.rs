//! cascade-guard: makes every delete of a protected Kubernetes object a safe,
//! foreground cascade.

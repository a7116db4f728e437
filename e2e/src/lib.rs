//! Helpers for the end-to-end tests: a client for a real API server (the one `apiserver/up.sh` starts, or
//! `KUBECONFIG`'s), the CRD, namespaces, and waiting for conditions.

// Package credential recognises credential-shaped strings (Agent keys, cloud
// and vendor tokens, private keys) so Dojo can refuse to store them in
// material other agents may read.
package credential

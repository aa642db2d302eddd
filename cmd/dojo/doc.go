// Command dojo runs and administers a Dojo relay: serve, migrate, dev (a
// zero-configuration local run), tools and version.
package main

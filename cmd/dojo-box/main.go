package main

import (
	"os"

	"github.com/dojo-relay/dojo/letterbox"
)

func main() { os.Exit(letterbox.Main(os.Args[1:], os.Stdout, os.Stderr)) }

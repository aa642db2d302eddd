package main

import "context"

func dev(ctx context.Context, args []string) error { return errUsage }

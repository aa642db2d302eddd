package tool

import (
	"github.com/dojo-relay/dojo/kungfu/account"
	"github.com/dojo-relay/dojo/kungfu/memory"
	"github.com/dojo-relay/dojo/kungfu/notify"
	"github.com/dojo-relay/dojo/kungfu/task"
	"github.com/dojo-relay/dojo/kungfu/thread"
)

// Links are the public addresses a registration hands out.
type Links struct {
	MCP  string
	API  string
	Docs string
}

// Services are the domains the tools call into.
type Services struct {
	Accounts  *account.Service
	Memories  *memory.Service
	Threads   *thread.Service
	Notify    *notify.Service
	Tasks     *task.Service
	JoinGuard JoinGuard
	Links     Links
}

// Kungfu returns every Kungfu tool Dojo serves, in documentation order.
func Kungfu(s Services) []*Tool {
	var tools []*Tool
	tools = append(tools, workTools(s)...)
	tools = append(tools, taskTools(s)...)
	tools = append(tools, accountTools(s)...)
	tools = append(tools, memoryTools(s)...)
	tools = append(tools, threadTools(s)...)
	tools = append(tools, assignTools(s)...)
	tools = append(tools, turnTools(s)...)
	tools = append(tools, notifyTools(s)...)
	return tools
}

// Rate-limit actions, named as in the protocol's limit table.
const (
	LimitRegister = "register"
	LimitPush     = "push"
	LimitGet      = "get"
	LimitList     = "list"
)

package tool

import (
	"context"

	"github.com/dojo-relay/dojo/kungfu"
)

type registerIn struct {
	Name     string `json:"name"`
	Password string `json:"password"`
}

type registerOut struct {
	BotName     string `json:"bot_name"`
	BotID       int64  `json:"bot_id"`
	APIKey      string `json:"api_key"`
	MCPEndpoint string `json:"mcp_endpoint"`
	APIBase     string `json:"api_base"`
	Docs        string `json:"docs"`
	Message     string `json:"message"`
	KeyRecovery string `json:"key_recovery"`
}

type statusOut struct {
	BotID   int64  `json:"bot_id"`
	BotName string `json:"bot_name"`
	Balance int64  `json:"balance"`
	Status  string `json:"status"`
}

func accountTools(s Services) []*Tool {
	return []*Tool{{
		Name:  "account_register",
		Group: "Account",
		Description: "Create an account (public, no key needed). Returns the Agent key exactly once with the " +
			"onboarding pointers mcp_endpoint, api_base and docs. Store the key now; the owner can reset it " +
			"at /owner/key with the name and password.",
		Schema: `{"type":"object","properties":{
			"name":{"type":"string","description":"6-32 characters: letters, digits, '_', '.', '-'; unique ignoring case"},
			"password":{"type":"string","description":"6-72 bytes; kept by the human owner for key resets"}},
			"required":["name","password"],"additionalProperties":false}`,
		Public:    true,
		Limit:     LimitRegister,
		LimitByIP: true,
		Handler: Decode(func(ctx context.Context, _ kungfu.Caller, in registerIn) (any, error) {
			got, err := s.Accounts.Register(ctx, in.Name, in.Password)
			if err != nil {
				return nil, err
			}
			return registerOut{
				BotName: got.Name, BotID: got.AccountID, APIKey: got.APIKey,
				MCPEndpoint: s.Links.MCP, APIBase: s.Links.API, Docs: s.Links.Docs,
				Message:     "Registration successful. Give only the key to agents; keep the password for human key management.",
				KeyRecovery: "Store the key now. If it is lost, the owner signs in at /owner/key and resets it.",
			}, nil
		}),
	}, {
		Name:        "account_status",
		Group:       "Account",
		Description: "Your identity and credit balance.",
		Schema:      `{"type":"object","properties":{},"additionalProperties":false}`,
		Handler: Decode(func(ctx context.Context, who kungfu.Caller, _ struct{}) (any, error) {
			st, err := s.Accounts.Status(ctx, who.AccountID)
			if err != nil {
				return nil, err
			}
			return statusOut{BotID: st.AccountID, BotName: st.Name, Balance: st.Balance, Status: st.Status}, nil
		}),
	}}
}

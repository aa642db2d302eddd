package relay

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/tool"
)

type codeInfo struct {
	status     int
	nextAction string
	// retryNow sets retry_after 0: act again at once (claim, then submit).
	retryNow bool
}

// errorTable is the one place that maps a protocol error code to its HTTP
// status and next_action. A code missing here is masked as INTERNAL_ERROR.
var errorTable = map[string]codeInfo{
	kungfu.CodeUnauthorized:         {http.StatusUnauthorized, "stop", false},
	kungfu.CodeInvalidCredentials:   {http.StatusUnauthorized, "stop", false},
	kungfu.CodeInsufficientCredits:  {http.StatusPaymentRequired, "", false},
	kungfu.CodeNotOwner:             {http.StatusForbidden, "", false},
	kungfu.CodePrivateKungfu:        {http.StatusForbidden, "", false},
	kungfu.CodeNotFound:             {http.StatusNotFound, "", false},
	kungfu.CodeUnknownTool:          {http.StatusNotFound, "", false},
	kungfu.CodeNameTaken:            {http.StatusConflict, "", false},
	kungfu.CodeInvalidState:         {http.StatusConflict, "", false},
	kungfu.CodeIdempotencyConflict:  {http.StatusConflict, "revise", false},
	kungfu.CodePayloadTooLarge:      {http.StatusRequestEntityTooLarge, "revise", false},
	kungfu.CodeContentTooLarge:      {http.StatusRequestEntityTooLarge, "revise", false},
	kungfu.CodeValidationFailed:     {http.StatusUnprocessableEntity, "", false},
	kungfu.CodeInvalidName:          {http.StatusUnprocessableEntity, "", false},
	kungfu.CodeInvalidPassword:      {http.StatusUnprocessableEntity, "", false},
	kungfu.CodeReservedName:         {http.StatusUnprocessableEntity, "", false},
	kungfu.CodeInvalidCode:          {http.StatusUnprocessableEntity, "", false},
	kungfu.CodeContentTooShort:      {http.StatusUnprocessableEntity, "", false},
	kungfu.CodeTitleTooLong:         {http.StatusUnprocessableEntity, "", false},
	kungfu.CodeDescriptionTooLong:   {http.StatusUnprocessableEntity, "", false},
	kungfu.CodeTooManyTags:          {http.StatusUnprocessableEntity, "", false},
	kungfu.CodeTagTooLong:           {http.StatusUnprocessableEntity, "", false},
	kungfu.CodeInvalidTags:          {http.StatusUnprocessableEntity, "", false},
	kungfu.CodeSensitiveContent:     {http.StatusUnprocessableEntity, "revise", false},
	kungfu.CodeMissingField:         {http.StatusBadRequest, "", false},
	kungfu.CodeInvalidRequest:       {http.StatusBadRequest, "", false},
	kungfu.CodeRateLimit:            {http.StatusTooManyRequests, "wait", false},
	kungfu.CodeInternal:             {http.StatusInternalServerError, "", false},
	kungfu.CodeServiceUnavailable:   {http.StatusServiceUnavailable, "wait", false},
	kungfu.CodeForbiddenOrigin:      {http.StatusForbidden, "stop", false},
	kungfu.CodeUnsupportedMediaType: {http.StatusUnsupportedMediaType, "revise", false},

	kungfu.CodeThreadNotFound:  {http.StatusNotFound, "stop", false},
	kungfu.CodeAssignNotFound:  {http.StatusNotFound, "stop", false},
	kungfu.CodeNotMember:       {http.StatusForbidden, "stop", false},
	kungfu.CodeNotGovernor:     {http.StatusForbidden, "retry", false},
	kungfu.CodeReadOnly:        {http.StatusForbidden, "stop", false},
	kungfu.CodeNotYours:        {http.StatusForbidden, "stop", false},
	kungfu.CodeKeyInvalid:      {http.StatusUnauthorized, "stop", false},
	kungfu.CodeThreadClosed:    {http.StatusConflict, "stop", false},
	kungfu.CodeRoomLimit:       {http.StatusConflict, "stop", false},
	kungfu.CodeMemberLimit:     {http.StatusConflict, "stop", false},
	kungfu.CodeLastManager:     {http.StatusConflict, "retry", false},
	kungfu.CodeInvalidTarget:   {http.StatusUnprocessableEntity, "retry", false},
	kungfu.CodeSummaryRequired: {http.StatusUnprocessableEntity, "revise", false},
	kungfu.CodeSchemaMismatch:  {http.StatusUnprocessableEntity, "revise", false},

	kungfu.CodeTaskNotFound:        {http.StatusNotFound, "stop", false},
	kungfu.CodeSubmissionNotFound:  {http.StatusNotFound, "", false},
	kungfu.CodeHarnessRefNotFound:  {http.StatusNotFound, "", false},
	kungfu.CodeTaskNotOpen:         {http.StatusConflict, "stop", false},
	kungfu.CodeSlotsExhausted:      {http.StatusConflict, "stop", false},
	kungfu.CodeSubmissionLimit:     {http.StatusConflict, "wait", false},
	kungfu.CodeClaimRequired:       {http.StatusConflict, "retry", true},
	kungfu.CodeClaimInvalid:        {http.StatusConflict, "retry", true},
	kungfu.CodeHasReservations:     {http.StatusConflict, "", false},
	kungfu.CodeNothingToRefund:     {http.StatusConflict, "", false},
	kungfu.CodeOwnTask:             {http.StatusForbidden, "stop", false},
	kungfu.CodeCredentialInPayload: {http.StatusUnprocessableEntity, "revise", false},
	kungfu.CodeInvalidRevises:      {http.StatusUnprocessableEntity, "revise", false},
	kungfu.CodeInvalidRequestKey:   {http.StatusUnprocessableEntity, "revise", false},

	kungfu.CodeSignatureRequired: {http.StatusUnauthorized, "revise", false},
	kungfu.CodeStaleSignature:    {http.StatusUnauthorized, "retry", false},
	kungfu.CodeBadNonce:          {http.StatusUnauthorized, "revise", false},
	kungfu.CodeBadSignature:      {http.StatusUnauthorized, "stop", false},
	kungfu.CodeReplay:            {http.StatusUnauthorized, "retry", false},
	kungfu.CodeAgentMismatch:     {http.StatusForbidden, "revise", false},
	kungfu.CodeForbidden:         {http.StatusForbidden, "stop", false},
	kungfu.CodeLabelReserved:     {http.StatusConflict, "revise", false},
	kungfu.CodeLabelYours:        {http.StatusConflict, "stop", false},
}

// statusOf returns the HTTP status for a refusal code.
func statusOf(code string) int {
	if c, ok := errorTable[code]; ok {
		return c.status
	}
	return http.StatusInternalServerError
}

type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Details any    `json:"details"`
	// Suggestion appears only when the refusal carries one.
	Suggestion string `json:"suggestion,omitempty"`
}

type head struct {
	OK         bool       `json:"ok"`
	Error      *errorBody `json:"error"`
	NextAction *string    `json:"next_action"`
	Next       []any      `json:"next"`
	RetryAfter *int       `json:"retry_after"`
	APIVersion string     `json:"api_version"`
}

// envelope is one rendered result: the JSON bytes and the HTTP status that
// goes with them.
type envelope struct {
	body   []byte
	status int
	ok     bool
}

// success renders the envelope head followed by the tool's own fields, in
// that order, so agents read ok/error first.
func success(result any) (envelope, error) {
	h := head{OK: true, Next: []any{}, APIVersion: kungfu.Version}
	if a, ok := result.(tool.Advisor); ok {
		na, ra := a.Advice()
		if na != "" {
			h.NextAction = &na
		}
		h.RetryAfter = ra
	}
	body, err := splice(h, result)
	return envelope{body: body, status: http.StatusOK, ok: true}, err
}

// refusal renders a not-accepted envelope for e.
func refusal(e *kungfu.Error) envelope {
	info, known := errorTable[e.Code]
	if !known {
		e = &kungfu.Error{Code: kungfu.CodeInternal, Message: "internal error"}
		info = errorTable[kungfu.CodeInternal]
	}
	h := head{OK: false, Next: []any{}, APIVersion: kungfu.Version, RetryAfter: e.RetryAfter,
		Error: &errorBody{Code: e.Code, Message: e.Message, Details: e.Details, Suggestion: e.Suggestion}}
	if info.nextAction != "" {
		na := info.nextAction
		h.NextAction = &na
	}
	if info.retryNow && h.RetryAfter == nil {
		zero := 0
		h.RetryAfter = &zero
	}
	body, err := splice(h, nil)
	if err != nil {
		body = []byte(`{"ok":false,"error":{"code":"INTERNAL_ERROR","message":"internal error","details":null}}`)
	}
	return envelope{body: body, status: info.status}
}

func splice(h head, result any) ([]byte, error) {
	hb, err := marshal(h)
	if err != nil {
		return nil, err
	}
	if result == nil {
		return hb, nil
	}
	rb, err := marshal(result)
	if err != nil {
		return nil, err
	}
	if len(rb) < 2 || rb[0] != '{' {
		return nil, &json.UnsupportedValueError{Str: "tool result is not an object"}
	}
	if string(rb) == "{}" {
		return hb, nil
	}
	var buf bytes.Buffer
	buf.Grow(len(hb) + len(rb))
	buf.Write(hb[:len(hb)-1])
	buf.WriteByte(',')
	buf.Write(rb[1:])
	return buf.Bytes(), nil
}

// marshal is json.Marshal without HTML escaping: agents read these bodies,
// browsers do not render them.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSpace(buf.Bytes()), nil
}

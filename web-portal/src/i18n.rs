//! The portal's two languages: chosen by the `kumo_lang` cookie (the
//! switch), else by `Accept-Language`, else English.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    En,
    Ja,
}

impl Lang {
    pub fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Ja => "ja",
        }
    }

    pub fn parse(s: &str) -> Option<Lang> {
        match s {
            "en" => Some(Lang::En),
            "ja" => Some(Lang::Ja),
            _ => None,
        }
    }

    /// The cookie's choice, else the first of `Accept-Language` we speak.
    pub fn pick(cookie: Option<&str>, accept_language: Option<&str>) -> Lang {
        if let Some(l) = cookie.and_then(Lang::parse) {
            return l;
        }
        let mut tags: Vec<(f32, &str)> = accept_language
            .unwrap_or("")
            .split(',')
            .filter_map(|part| {
                let mut it = part.trim().split(';');
                let tag = it.next()?.trim();
                let q = it
                    .find_map(|p| p.trim().strip_prefix("q="))
                    .and_then(|q| q.parse().ok())
                    .unwrap_or(1.0);
                (!tag.is_empty()).then_some((q, tag))
            })
            .collect();
        tags.sort_by(|a, b| b.0.total_cmp(&a.0));
        tags.iter()
            .find_map(|(_, t)| {
                let primary = t.split('-').next().unwrap_or("").to_ascii_lowercase();
                Lang::parse(&primary)
            })
            .unwrap_or(Lang::En)
    }
}

/// A VM state or action word as the page shows it (the attribute keeps
/// the API's word).
pub fn word(lang: Lang, w: &str) -> String {
    let ja = match w {
        "pending" => "待機中",
        "scheduled" => "配置済み",
        "provisioning" => "準備中",
        "running" => "実行中",
        "stopped" => "停止",
        "deleting" => "削除中",
        "preempting" => "回収予告",
        "preempted" => "回収済み",
        "suspended" => "一時保存",
        "shelving" => "退避中",
        "shelved" => "退避済み",
        "shelve" => "退避",
        "unshelve" => "復帰",
        "unshelve-anywhere" => "別ホストで復帰",
        "detach" => "切断",
        "creating" => "作成中",
        "available" => "利用可能",
        "attached" => "接続中",
        "moving" => "移動中",
        "error" => "エラー",
        "unknown" => "不明",
        "start" => "起動",
        "stop" => "停止する",
        "reboot" => "再起動",
        "delete" => "削除",
        "revoked" => "失効",
        "used" => "使用済み",
        "expired" => "期限切れ",
        "valid" => "有効",
        "uses" => "使用回数",
        other => other,
    };
    match lang {
        Lang::En => w.to_owned(),
        Lang::Ja => ja.to_owned(),
    }
}

/// A message in the language.
pub fn t(lang: Lang, key: Msg) -> &'static str {
    use Msg::*;
    match (lang, key) {
        (Lang::En, AppName) => "Kumo GPU cloud",
        (Lang::Ja, AppName) => "Kumo GPU クラウド",
        (Lang::En, SignIn) => "Sign in",
        (Lang::Ja, SignIn) => "ログイン",
        (Lang::En, ChooseInstitution) => "Choose your institution",
        (Lang::Ja, ChooseInstitution) => "所属機関を選択してください",
        (Lang::En, Search) => "Search institutions",
        (Lang::Ja, Search) => "機関を検索",
        (Lang::En, NoProviders) => "No institution is configured; administrators sign in with an API token.",
        (Lang::Ja, NoProviders) => "機関が設定されていません。管理者は API トークンでログインします。",
        (Lang::En, Dashboard) => "Dashboard",
        (Lang::Ja, Dashboard) => "ダッシュボード",
        (Lang::En, MyTenants) => "My projects",
        (Lang::Ja, MyTenants) => "参加プロジェクト",
        (Lang::En, NoTenants) => "You are not a member of any project yet. Ask a project owner to add you.",
        (Lang::Ja, NoTenants) => "まだどのプロジェクトにも参加していません。プロジェクトのオーナーに追加を依頼してください。",
        (Lang::En, Role) => "Role",
        (Lang::Ja, Role) => "ロール",
        (Lang::En, Vms) => "VMs",
        (Lang::Ja, Vms) => "VM 数",
        (Lang::En, Gpus) => "GPUs in use / quota",
        (Lang::Ja, Gpus) => "使用中 GPU / 上限",
        (Lang::En, Points) => "Points",
        (Lang::Ja, Points) => "ポイント残高",
        (Lang::En, SignOut) => "Sign out",
        (Lang::Ja, SignOut) => "ログアウト",
        (Lang::En, Language) => "日本語",
        (Lang::Ja, Language) => "English",
        (Lang::En, CliLogin) => "Sign the command line in",
        (Lang::Ja, CliLogin) => "コマンドラインツールへのログイン",
        (Lang::En, CliLoginAsk) => "The kumo command on this computer asks to act as you: it gets an API token valid for 90 days, which you can revoke among your tokens.",
        (Lang::Ja, CliLoginAsk) => "このコンピューターの kumo コマンドが、あなたとして操作する許可を求めています。90 日間有効な API トークンが発行され、トークン一覧から取り消せます。",
        (Lang::En, CliHandoff) => "Handing your new token to the kumo command on this computer…",
        (Lang::Ja, CliHandoff) => "新しいトークンをこのコンピューターの kumo コマンドに渡しています…",
        (Lang::En, Continue) => "Continue",
        (Lang::Ja, Continue) => "続ける",
        (Lang::En, Networks) => "Networks",
        (Lang::Ja, Networks) => "ネットワーク",
        (Lang::En, Allow) => "Allow",
        (Lang::Ja, Allow) => "許可する",
        (Lang::En, VmsTitle) => "Virtual machines",
        (Lang::Ja, VmsTitle) => "仮想マシン",
        (Lang::En, Name) => "Name",
        (Lang::Ja, Name) => "名前",
        (Lang::En, State) => "State",
        (Lang::Ja, State) => "状態",
        (Lang::En, Host) => "Host",
        (Lang::Ja, Host) => "ホスト",
        (Lang::En, Create) => "Create",
        (Lang::Ja, Create) => "作成",
        (Lang::En, Memory) => "Memory (GiB)",
        (Lang::Ja, Memory) => "メモリ (GiB)",
        (Lang::En, Segment) => "Segment",
        (Lang::Ja, Segment) => "セグメント",
        (Lang::En, Topology) => "Topology",
        (Lang::Ja, Topology) => "トポロジー",
        (Lang::En, Events) => "Events",
        (Lang::Ja, Events) => "イベント",
        (Lang::En, Billing) => "Points and usage",
        (Lang::Ja, Billing) => "ポイントと利用量",
        (Lang::En, Usage30) => "Usage over the last 30 days",
        (Lang::Ja, Usage30) => "過去 30 日間の利用量",
        (Lang::En, Statements) => "Monthly statements",
        (Lang::Ja, Statements) => "月次明細",
        (Lang::En, Ledger) => "Latest charges",
        (Lang::Ja, Ledger) => "最近の課金",
        (Lang::En, Tokens) => "API tokens",
        (Lang::Ja, Tokens) => "API トークン",
        (Lang::En, Hosts) => "Hosts",
        (Lang::Ja, Hosts) => "ホスト",
        (Lang::En, Tenants) => "Projects",
        (Lang::Ja, Tenants) => "プロジェクト",
        (Lang::En, Rates) => "Rates",
        (Lang::Ja, Rates) => "料金",
        (Lang::En, JoinTokens) => "Join tokens",
        (Lang::Ja, JoinTokens) => "ホスト登録トークン",
        (Lang::En, Clusters) => "Clusters",
        (Lang::Ja, Clusters) => "クラスター",
        (Lang::En, Segments) => "Segments",
        (Lang::Ja, Segments) => "セグメント",
        (Lang::En, Members) => "Members",
        (Lang::Ja, Members) => "メンバー",
        (Lang::En, Kind) => "Kind",
        (Lang::Ja, Kind) => "種類",
        (Lang::En, Size) => "VMs",
        (Lang::Ja, Size) => "台数",
        (Lang::En, GpusEach) => "GPUs per VM",
        (Lang::Ja, GpusEach) => "VM あたりの GPU",
        (Lang::En, Revoke) => "Revoke",
        (Lang::Ja, Revoke) => "取り消す",
        (Lang::En, Description) => "Description",
        (Lang::Ja, Description) => "説明",
        (Lang::En, Created) => "Created",
        (Lang::Ja, Created) => "作成日時",
        (Lang::En, Expires) => "Expires",
        (Lang::Ja, Expires) => "有効期限",
        (Lang::En, LastUsed) => "Last used",
        (Lang::Ja, LastUsed) => "最終使用",
        (Lang::En, User) => "User",
        (Lang::Ja, User) => "ユーザー",
        (Lang::En, AddMember) => "Add or change a member",
        (Lang::Ja, AddMember) => "メンバーの追加・変更",
        (Lang::En, Remove) => "Remove",
        (Lang::Ja, Remove) => "外す",
        (Lang::En, ShownOnce) => "Copy it now: it is not shown again.",
        (Lang::Ja, ShownOnce) => "今すぐコピーしてください。再表示されません。",
        (Lang::En, GpuUse) => "GPU use",
        (Lang::Ja, GpuUse) => "GPU 使用状況",
        (Lang::En, Heartbeat) => "Last heartbeat",
        (Lang::Ja, Heartbeat) => "最終ハートビート",
        (Lang::En, Class) => "Resource class",
        (Lang::Ja, Class) => "リソース種別",
        (Lang::En, Guaranteed) => "Guaranteed (per hour)",
        (Lang::Ja, Guaranteed) => "保証 (1 時間あたり)",
        (Lang::En, Spot) => "Spot (per hour)",
        (Lang::Ja, Spot) => "スポット (1 時間あたり)",
        (Lang::En, EffectiveFrom) => "In force from",
        (Lang::Ja, EffectiveFrom) => "適用開始",
        (Lang::En, SetRate) => "Set a price",
        (Lang::Ja, SetRate) => "料金を設定",
        (Lang::En, ValidFor) => "Valid for (seconds)",
        (Lang::Ja, ValidFor) => "有効期間 (秒)",
        (Lang::En, Empty) => "Nothing here yet.",
        (Lang::Ja, Empty) => "まだありません。",
        (Lang::En, Matrix) => "Topology matrix",
        (Lang::Ja, Matrix) => "トポロジー行列",
        (Lang::En, Allocations) => "Allocations",
        (Lang::Ja, Allocations) => "割り当て",
        (Lang::En, DisplayName) => "Display name",
        (Lang::Ja, DisplayName) => "表示名",
        (Lang::En, Ingress) => "Ingress rules",
        (Lang::Ja, Ingress) => "受信許可ルール",
        (Lang::En, Egress) => "Egress (leaves as)",
        (Lang::Ja, Egress) => "外向き通信 (送信元)",
        (Lang::En, EgressOff) => "off",
        (Lang::Ja, EgressOff) => "なし",
        (Lang::En, PublicIps) => "Public IP addresses",
        (Lang::Ja, PublicIps) => "グローバル IP アドレス",
        (Lang::En, PublicIpsEmpty) => "No public address yet: `kumo public-ip allocate`, then `kumo public-ip attach ADDR --vm VM`.",
        (Lang::Ja, PublicIpsEmpty) => "グローバル IP アドレスはまだありません。`kumo public-ip allocate` の後 `kumo public-ip attach ADDR --vm VM` で VM に割り当てます。",
        (Lang::En, Address) => "Address",
        (Lang::Ja, Address) => "アドレス",
        (Lang::En, Pool) => "Pool",
        (Lang::Ja, Pool) => "プール",
        (Lang::En, AttachedTo) => "Attached to",
        (Lang::Ja, AttachedTo) => "割り当て先",
        (Lang::En, PortForwards) => "Port forwards",
        (Lang::Ja, PortForwards) => "ポートフォワード",
        (Lang::En, PortForwardsEmpty) => "No port forward yet: `kumo port-forward create --public ADDR:2222/tcp --to VM:22`.",
        (Lang::Ja, PortForwardsEmpty) => "ポートフォワードはまだありません。`kumo port-forward create --public ADDR:2222/tcp --to VM:22` で作成します。",
        (Lang::En, Volumes) => "Volumes",
        (Lang::Ja, Volumes) => "ボリューム",
        (Lang::En, VolumesEmpty) => "No volume yet: create one below, or `kumo volume create NAME --size-gib N`.",
        (Lang::Ja, VolumesEmpty) => "ボリュームはまだありません。下のフォームか `kumo volume create NAME --size-gib N` で作成します。",
        (Lang::En, SizeGib) => "Size (GiB)",
        (Lang::Ja, SizeGib) => "サイズ (GiB)",
        (Lang::En, InGuest) => "In the guest",
        (Lang::Ja, InGuest) => "ゲスト内のパス",
        (Lang::En, AttachVolume) => "Attach a volume to a VM on its host",
        (Lang::Ja, AttachVolume) => "ボリュームを同じホストの VM に接続",
        (Lang::En, Attach) => "Attach",
        (Lang::Ja, Attach) => "接続",
        (Lang::En, ForwardTo) => "To",
        (Lang::Ja, ForwardTo) => "転送先",
        (Lang::En, Fabric) => "RoCE ports",
        (Lang::Ja, Fabric) => "RoCE ポート",
        (Lang::En, SignInToken) => "Administrators: sign in with an API token",
        (Lang::Ja, SignInToken) => "管理者: API トークンでログイン",
        (Lang::En, Any) => "(any)",
        (Lang::Ja, Any) => "(指定なし)",
        (Lang::En, Template) => "Template",
        (Lang::Ja, Template) => "テンプレート",
        (Lang::En, Token) => "Token",
        (Lang::Ja, Token) => "トークン",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    AppName,
    SignIn,
    ChooseInstitution,
    Search,
    NoProviders,
    Dashboard,
    MyTenants,
    NoTenants,
    Role,
    Vms,
    Gpus,
    Points,
    SignOut,
    Language,
    CliLogin,
    CliLoginAsk,
    CliHandoff,
    Networks,
    Continue,
    Allow,
    VmsTitle,
    Name,
    State,
    Host,
    Create,
    Memory,
    Segment,
    Topology,
    Events,
    Billing,
    Usage30,
    Statements,
    Ledger,
    Tokens,
    Hosts,
    Tenants,
    Rates,
    JoinTokens,
    Clusters,
    Segments,
    Members,
    Kind,
    Size,
    GpusEach,
    Revoke,
    Description,
    Created,
    Expires,
    LastUsed,
    User,
    AddMember,
    Remove,
    ShownOnce,
    GpuUse,
    Heartbeat,
    Class,
    Guaranteed,
    Spot,
    EffectiveFrom,
    SetRate,
    ValidFor,
    Empty,
    Matrix,
    Allocations,
    DisplayName,
    Ingress,
    Egress,
    EgressOff,
    PublicIps,
    PublicIpsEmpty,
    Address,
    Pool,
    AttachedTo,
    PortForwards,
    PortForwardsEmpty,
    ForwardTo,
    Volumes,
    VolumesEmpty,
    SizeGib,
    InGuest,
    AttachVolume,
    Attach,
    Fabric,
    SignInToken,
    Token,
    Any,
    Template,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_actions_in_japanese() {
        assert_eq!(word(Lang::Ja, "running"), "実行中");
        assert_eq!(word(Lang::En, "running"), "running");
        assert_eq!(word(Lang::Ja, "something-new"), "something-new");
    }

    #[test]
    fn the_switch_wins_then_accept_language_by_weight() {
        assert_eq!(Lang::pick(Some("ja"), Some("en")), Lang::Ja);
        assert_eq!(Lang::pick(None, Some("ja-JP,ja;q=0.9,en;q=0.8")), Lang::Ja);
        assert_eq!(Lang::pick(None, Some("en;q=0.5, ja;q=0.9")), Lang::Ja);
        assert_eq!(Lang::pick(None, Some("fr, en-GB;q=0.7")), Lang::En);
        assert_eq!(Lang::pick(Some("xx"), None), Lang::En);
    }
}

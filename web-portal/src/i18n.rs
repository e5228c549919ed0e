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
        "queued" => "順番待ち",
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
        "lost" => "喪失",
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
        "healthy" => "正常",
        "suspect" => "要注意",
        "quarantined" => "隔離中",
        "repairing" => "修理中",
        "validating" => "検証中",
        "Segment" => "セグメント",
        "Address" => "アドレス",
        "Public address" => "公開アドレス",
        "Wait for room" => "空きを待つ",
        "Reservation" => "予約",
        "Size" => "サイズ",
        "State" => "状態",
        "Volume" => "ボリューム",
        "Share" => "共有ストレージ",
        "Path in the guest" => "ゲスト内のパス",
        "Read-only" => "読み取り専用",
        "Tag" => "タグ",
        "Condition" => "状況",
        "read-only" => "読み取り専用",
        "yes" => "はい",
        "no" => "いいえ",
        "over-size" => "はい（サイズ超過：各 VM の次回起動から読み取り専用）",
        "In the guest" => "ゲスト内",
        "How to reach it" => "接続方法",
        "Actions" => "操作",
        "When" => "日時",
        "Spot VM" => "スポット VM",
        "Health" => "健全性",
        "degraded" => "縮退",
        "repair" => "修復",
        "Repair by itself" => "自動修復",
        "Spares" => "予備",
        "member" => "メンバー",
        "viewer" => "閲覧者",
        "owner" => "オーナー",
        "This month" => "今月の利用額",
        "Resource" => "リソース",
        "Duration" => "時間",
        "Points" => "ポイント",
        "no-vms" => "VM はまだありません。下のフォームか kumo vm create NAME --tenant TENANT --gpus 1 --wait で作成できます。",
        "no-usage" => "この 30 日間の課金はありません（VM は実行中、ディスクは存在する間に課金されます）",
        "no-points" => "ポイントがありません。プラットフォーム管理者に付与を依頼してください（新しい VM は作成できません）。",
        "no-network" => "セグメント上のアドレスがないため、コンソールからのみ接続できます。作成時にセグメントを指定し、公開アドレス（kumo public-ip allocate / attach）かポート転送を付けると SSH で入れます。",
        "no-public" => "公開アドレスがまだありません：kumo public-ip allocate と kumo public-ip attach（またはポート転送）で外から SSH できます。",
        other => other,
    };
    match lang {
        Lang::En => match w {
            "no-vms" => "No VM yet: create one below, or kumo vm create NAME --tenant TENANT --gpus 1 --wait.".into(),
            "no-usage" => "Nothing charged in these 30 days (VMs are charged while they run, disks while they exist)".into(),
            "no-points" => "No points: ask a platform administrator for a grant (new VMs are refused until then).".into(),
            "no-network" => "It has no address on a segment, so only its console reaches it. Give it a segment when you create it, then a public address (kumo public-ip allocate / attach) or a port forward, and SSH in.".into(),
            "over-size" => "yes (over its size: read-only from each VM's next start)".into(),
            "no-public" => "No public address yet: kumo public-ip allocate and kumo public-ip attach (or a port forward) let SSH in from outside.".into(),
            _ => w.to_owned(),
        },
        Lang::Ja => ja.to_owned(),
    }
}

/// A field's refusal in the page's language: the messages the portal and
/// the API give most; any other stays as the API said it.
pub fn field_message(lang: Lang, m: &str) -> String {
    if lang == Lang::En {
        return match m {
            "required" => "Enter a value",
            "a whole number" => "Enter a whole number",
            other => other,
        }
        .to_owned();
    }
    let ja = match m {
        "required" => "入力してください",
        "a whole number" => "整数で入力してください",
        "must not be blank" => "空にはできません",
        "must be in the future" => "未来の日時を指定してください",
        "must not contain control characters" => "制御文字は使えません",
        "1 to 3650" => "1〜3650 の範囲で指定してください",
        _ if m.starts_with("must match [a-z][a-z0-9-]{2,62}") => {
            "英小文字・数字・ハイフンで 3〜63 文字、先頭は英小文字にしてください"
        }
        _ if m.starts_with("must match [a-z][a-z0-9._-]{1,62}") => {
            "英小文字・数字・ドット・下線・ハイフンで 2〜63 文字、先頭は英小文字にしてください"
        }
        _ => return m.to_owned(),
    };
    ja.to_owned()
}

/// A share's mount as its VM's host reports it (`mounted`, `at the next
/// start (…)`, `failed: …`), in the page's language; the host's reasons
/// stay as it said them.
pub fn mount_condition(lang: Lang, c: &str) -> String {
    if lang == Lang::En {
        return c.to_owned();
    }
    const LIBVIRT: &str = "libvirt cannot change a running VM's share";
    let ja = match c {
        "mounted" => "マウント済み",
        "mounted read-only" => "マウント済み（読み取り専用）",
        "at the next start" => "次回起動時にマウント",
        "at the next start (libvirt cannot add a share to a running VM)" => {
            "次回起動時にマウント（実行中の VM には追加できません）"
        }
        _ if c == format!("read-only from the next start ({LIBVIRT})") => {
            "次回起動から読み取り専用（実行中の VM の共有は変更できません）"
        }
        _ if c == format!("writable from the next start ({LIBVIRT})") => {
            "次回起動から書き込み可能（実行中の VM の共有は変更できません）"
        }
        _ => {
            return match c.strip_prefix("failed: ") {
                Some(why) => format!("失敗: {why}"),
                None => c.to_owned(),
            }
        }
    };
    ja.to_owned()
}

/// What to enter in a form field, by the field's key.
pub fn help(lang: Lang, key: &str) -> &'static str {
    let (en, ja) = match key {
        "name" => (
            "3–63 lowercase letters, digits and dashes, starting with a letter",
            "英小文字・数字・ハイフンで 3〜63 文字、先頭は英小文字",
        ),
        "gpus" => (
            "Whole GPUs on one host, 0 to 8 (0: a CPU-only VM)",
            "1 台のホスト上の GPU 数、0〜8（0 は CPU のみの VM）",
        ),
        "gpu_model" => (
            "Any: whichever model has free GPUs; rates differ by model",
            "指定なし：空きのある機種。料金は機種ごとに異なります",
        ),
        "vcpus" => (
            "Empty: the default for its GPUs",
            "空欄：GPU 数に応じた既定値",
        ),
        "memory_gib" => (
            "GiB; empty: the default for its GPUs",
            "GiB 単位。空欄：GPU 数に応じた既定値",
        ),
        "template" => (
            "The OS image; empty: the platform's default",
            "OS イメージ。空欄：標準のもの",
        ),
        "spot" => (
            "Cheaper, but stopped when guaranteed VMs need its GPUs (with notice)",
            "安価ですが、保証 VM が GPU を必要とすると予告のうえ停止されます",
        ),
        "network" => (
            "Gives it an address; needed for SSH and public addresses",
            "アドレスが付きます。SSH や公開アドレスに必要です",
        ),
        "public_ip" => (
            "A floating address from the pools, attached to it, with SSH (TCP 22) opened on its segment; needs a segment",
            "プールから取得した公開アドレスを割り当て、セグメントで SSH（TCP 22）を開きます。セグメントが必要です",
        ),
        "queue" => (
            "When no host has room, wait in the fair queue (free while waiting; delete to cancel) instead of being refused",
            "空きがないとき、拒否せず公平キューで待ちます（待つ間は無料、削除で取り消し）",
        ),
        "reservation" => (
            "The name of the project's active reservation to run on (its GPU model, on the hosts it holds)",
            "使う予約の名前（プロジェクトの有効な予約。その GPU モデルで、予約したホストで動きます）",
        ),
        "ssh_key" => (
            "A public key (ssh-ed25519 AAAA…), written into the guest",
            "公開鍵（ssh-ed25519 AAAA…）。ゲストに書き込まれます",
        ),
        "cluster_size" => ("How many VMs, placed together", "VM の台数（まとめて配置）"),
        "auto_repair" => (
            "Replace a failed member (host lost, VM in error, a device quarantined) by itself, two minutes after; same name and address, fresh disk",
            "故障したメンバー（ホスト喪失・VM エラー・デバイス隔離）を 2 分後に自動で置き換えます。名前とアドレスは同じ、ディスクは新規",
        ),
        "cluster_gpus" => ("GPUs in each VM", "各 VM の GPU 数"),
        "cluster_spares" => (
            "Members' worth of room kept free beside the cluster for repairs, charged at the spare GPU rate",
            "修復用に同じスケーラブルユニット内で空けておくメンバー分の容量（予備 GPU 料金で課金）",
        ),
        "kind" => (
            "RoCE: RDMA between GPU VMs (NCCL); Ethernet for the rest",
            "RoCE：GPU VM 間の RDMA（NCCL）。その他は Ethernet",
        ),
        "cidr" => (
            "A private IPv4 range, /8 to /29",
            "プライベート IPv4 の範囲、/8〜/29",
        ),
        "mtu" => (
            "Empty: the largest the underlay allows",
            "空欄：下位ネットワークで可能な最大値",
        ),
        "ingress" => (
            "Allowed from outside, one rule per line: PROTOCOL[:PORTS]:SOURCE",
            "外部から許可する通信、1 行に 1 つ：PROTOCOL[:PORTS]:SOURCE",
        ),
        "size_gib" => (
            "GiB, kept when VMs are deleted",
            "GiB 単位。VM を削除しても残ります",
        ),
        "volume_vm" => ("Empty: make it detached", "空欄：どの VM にも接続しない"),
        "attach_vm" => (
            "A VM of this project on the volume's host",
            "ボリュームと同じホスト上の、このプロジェクトの VM",
        ),
        "attach" => (
            "A volume attached to no VM",
            "どの VM にも接続していないボリューム",
        ),
        "share" => (
            "A project share to mount: NAME[:/PATH][:ro] (path: default /mnt/NAME; ro: read-only)",
            "マウントする共有ストレージ：NAME[:/PATH][:ro]（パスの既定は /mnt/NAME、ro は読み取り専用）",
        ),
        "share_size_gib" => (
            "GiB, its size limit; charged per GiB-hour, kept when VMs are deleted",
            "GiB 単位のサイズ上限。GiB 時間あたりで課金され、VM を削除しても残ります",
        ),
        "grow" => ("An available share", "利用可能な共有ストレージ"),
        "grow_size_gib" => (
            "The new size in GiB, larger than now: a share never shrinks",
            "新しいサイズ（GiB）。現在より大きく：共有ストレージは縮小できません",
        ),
        "user" => (
            "Their user name, as shown after they sign in",
            "サインイン後に表示されるユーザー名",
        ),
        "role" => (
            "Owners also manage members and policies",
            "オーナーはメンバーとポリシーも管理できます",
        ),
        "token_description" => (
            "What it is for, to tell tokens apart",
            "用途（トークンの区別に使います）",
        ),
        "days" => (
            "Days until it stops working, 1 to 3650 (default 90)",
            "有効日数、1〜3650（既定 90）",
        ),
        "display_name" => (
            "Shown in the portal; empty: the name",
            "ポータルでの表示名。空欄：名前",
        ),
        "tenant_description" => ("Optional, up to 4000 characters", "任意、4000 文字まで"),
        "join_description" => ("Optional, up to 255 characters", "任意、255 文字まで"),
        "class" => (
            "gpu:MODEL, or vcpu, memory_gib, disk_gib",
            "gpu:機種名、または vcpu・memory_gib・disk_gib",
        ),
        "rate" => (
            "Points per hour, a decimal number",
            "1 時間あたりのポイント（小数可）",
        ),
        "ttl" => (
            "Seconds it may be used for, 60 to 2592000 (default 86400: a day)",
            "有効な秒数、60〜2592000（既定 86400：1 日）",
        ),
        "uses" => (
            "How many hosts may join with it (default 1)",
            "参加できるホスト数（既定 1）",
        ),
        _ => ("", ""),
    };
    match lang {
        Lang::En => en,
        Lang::Ja => ja,
    }
}

/// What the idle policy says of a VM: idle for how long, and what comes
/// when (or until when it is exempt).
/// How a GPU VM boots: UEFI, its 64-bit aperture and address width.
pub fn boot_sentence(lang: Lang, b: &crate::Boot) -> String {
    match (lang, b.aperture_gib, b.phys_bits) {
        (Lang::En, Some(gib), Some(bits)) => format!(
            "Boots UEFI (OVMF) with a {gib} GiB 64-bit MMIO aperture for its devices' BARs and {bits}-bit guest addresses."
        ),
        (Lang::Ja, Some(gib), Some(bits)) => format!(
            "UEFI (OVMF) で起動します。デバイスの BAR 用 64 ビット MMIO 領域は {gib} GiB、ゲストのアドレス幅は {bits} ビットです。"
        ),
        (Lang::En, _, _) => "Boots UEFI (OVMF); its devices' BARs are unknown to the host, so it cannot start there.".into(),
        (Lang::Ja, _, _) => "UEFI (OVMF) で起動しますが、ホストがデバイスの BAR を読めないため、このホストでは起動できません。".into(),
    }
}

/// A host page's word on passthrough when nothing stands in its way.
pub fn passthrough_ready(lang: Lang, hugepages_free_gib: u64) -> String {
    match lang {
        Lang::En => format!(
            "Ready: the IOMMU is on, each device's IOMMU group and the ACS above it keep it apart; {hugepages_free_gib} GiB of hugepages free."
        ),
        Lang::Ja => format!(
            "準備完了: IOMMU が有効で、各デバイスは IOMMU グループと上流の ACS で分離されています。空きヒュージページは {hugepages_free_gib} GiB です。"
        ),
    }
}

/// An event scheduled for a VM, as its page says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduled {
    pub host: String,
    /// When, as shown.
    pub at: String,
    /// `evacuate`, `replace`, `stop` or `reclaimable` (borrowed).
    pub action: String,
    pub reason: Option<String>,
}

/// "Host gpu-7 has maintenance at …: this VM will be moved …".
pub fn scheduled_sentence(lang: Lang, e: &Scheduled) -> String {
    let why = e
        .reason
        .as_deref()
        .map(|r| match lang {
            Lang::En => format!(" ({r})"),
            Lang::Ja => format!("（{r}）"),
        })
        .unwrap_or_default();
    match (lang, e.action.as_str()) {
        (Lang::En, "evacuate") => format!(
            "Host {} has maintenance at {}{why}: this VM will then be moved to another host with its disks (kumo vm evacuate moves it now).",
            e.host, e.at
        ),
        (Lang::Ja, "evacuate") => format!(
            "ホスト {} は {} にメンテナンス予定です{why}。この VM はその時点でディスクごと別のホストへ移動します（kumo vm evacuate で今すぐ移動できます）。",
            e.host, e.at
        ),
        (Lang::En, "replace") => format!(
            "Host {} has maintenance at {}{why}: this cluster member will then be replaced on another host (same name and address, a fresh root disk).",
            e.host, e.at
        ),
        (Lang::Ja, "replace") => format!(
            "ホスト {} は {} にメンテナンス予定です{why}。このクラスタメンバーはその時点で別のホストに置き換えられます（名前とアドレスは同じ、ルートディスクは新規）。",
            e.host, e.at
        ),
        (Lang::En, "reclaimable") => format!(
            "Borrowed since {}: this VM runs above its project's guaranteed share of GPUs, and may be reclaimed, with notice, for a project within its own share.",
            e.at
        ),
        (Lang::Ja, "reclaimable") => format!(
            "{} から借用中：この VM はプロジェクトの保証 GPU 枠を超えて動いており、枠内のプロジェクトのために予告の上で回収されることがあります。",
            e.at
        ),
        (Lang::En, _) => format!(
            "Host {} has maintenance at {}{why}: this VM stays there, stopped, until it is over.",
            e.host, e.at
        ),
        (Lang::Ja, _) => format!(
            "ホスト {} は {} にメンテナンス予定です{why}。この VM は終了まで停止したままです。",
            e.host, e.at
        ),
    }
}

pub fn idle_sentence(lang: Lang, n: &IdleNote) -> String {
    let h = n.minutes / 60;
    let m = n.minutes % 60;
    let shelve = n.action == "shelve";
    match (lang, &n.exempt_until, &n.action_at) {
        (Lang::En, Some(u), _) => format!(
            "Its GPUs have been idle for {h} h {m} min; it is exempt from the idle policy until {u}."
        ),
        (Lang::Ja, Some(u), _) => format!(
            "GPU が {h} 時間 {m} 分アイドル状態です。{u} までアイドルポリシーの対象外です。"
        ),
        (Lang::En, None, Some(a)) if shelve => format!(
            "Its GPUs have been idle for {h} h {m} min: it will be shelved at {a} (disk and volumes kept) unless they are used or an owner exempts it."
        ),
        (Lang::Ja, None, Some(a)) if shelve => format!(
            "GPU が {h} 時間 {m} 分アイドル状態です。使用されるかオーナーが除外しない限り、{a} に退避されます (ディスクとボリュームは保持)。"
        ),
        (Lang::En, None, Some(a)) => format!(
            "Its GPUs have been idle for {h} h {m} min; its project will be told again at {a}. Shelve it if it is not needed."
        ),
        (Lang::Ja, None, Some(a)) => format!(
            "GPU が {h} 時間 {m} 分アイドル状態です。{a} に再度通知されます。不要なら退避してください。"
        ),
        (Lang::En, None, None) => format!("Its GPUs have been idle for {h} h {m} min."),
        (Lang::Ja, None, None) => format!("GPU が {h} 時間 {m} 分アイドル状態です。"),
    }
}

/// A VM's idle spell, as the pages tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleNote {
    pub minutes: i64,
    /// `notice` or `shelve`.
    pub action: String,
    pub action_at: Option<String>,
    pub exempt_until: Option<String>,
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
        (Lang::En, Console) => "Console",
        (Lang::Ja, Console) => "コンソール",
        (Lang::En, ConsoleHelp) => "The VM's serial console (ttyS0): what it printed since boot, then live. Use it when SSH does not reach the VM — log in, fix the firewall or network, and leave. One person types at a time; opening it to type takes it over.",
        (Lang::Ja, ConsoleHelp) => "VM のシリアルコンソール (ttyS0) です。起動からの出力に続いて、現在の出力が表示されます。SSH で接続できないときにログインして、ファイアウォールやネットワークの設定を直せます。入力できるのは一度に一人で、入力用に開くと前の人から引き継ぎます。",
        (Lang::En, ConsoleNoTerminal) => "The terminal (xterm.js) is not installed in this build: run ./x start, or npm ci in web-portal/assets, and build again. The text box below still types into the console.",
        (Lang::Ja, ConsoleNoTerminal) => "このビルドには端末 (xterm.js) が入っていません。./x start を実行するか、web-portal/assets で npm ci を実行してビルドし直してください。下のテキスト欄からは入力できます。",
        (Lang::En, SendText) => "Send text",
        (Lang::Ja, SendText) => "テキストを送信",
        (Lang::En, SendTextHelp) => "Typed into the console as if on a keyboard: long passwords, commands to paste.",
        (Lang::Ja, SendTextHelp) => "キーボードから打ったようにコンソールへ入力します。長いパスワードや貼り付けたいコマンドに。",
        (Lang::En, PressEnter) => "Press Enter after it",
        (Lang::Ja, PressEnter) => "最後に Enter を押す",
        (Lang::En, Send) => "Send",
        (Lang::Ja, Send) => "送信",
        (Lang::En, Power) => "Keys and power",
        (Lang::Ja, Power) => "キー操作と電源",
        (Lang::En, PowerHelp) => "Ctrl-Alt-Del is pressed on the VM's keyboard (most systems reboot); Reboot asks the VM to restart.",
        (Lang::Ja, PowerHelp) => "Ctrl-Alt-Del は VM のキーボードで押されます (多くのシステムは再起動します)。再起動は VM に再起動を求めます。",
        (Lang::En, TakeOver) => "Take over typing",
        (Lang::Ja, TakeOver) => "入力を引き継ぐ",
        (Lang::En, Reconnect) => "Connect again",
        (Lang::Ja, Reconnect) => "再接続",
        (Lang::En, ConsoleConnecting) => "Connecting…",
        (Lang::Ja, ConsoleConnecting) => "接続しています…",
        (Lang::En, ConsoleWriting) => "Connected: you are typing.",
        (Lang::Ja, ConsoleWriting) => "接続しました。入力できます。",
        (Lang::En, ConsoleReading) => "Connected, read-only.",
        (Lang::Ja, ConsoleReading) => "接続しました (閲覧のみ)。",
        (Lang::En, ConsoleTakenOver) => "took typing over; you are read-only now.",
        (Lang::Ja, ConsoleTakenOver) => "が入力を引き継ぎました。閲覧のみになりました。",
        (Lang::En, ConsoleReadOnly) => "Read-only now:",
        (Lang::Ja, ConsoleReadOnly) => "閲覧のみになりました:",
        (Lang::En, ConsoleTookOver) => "You took typing over from",
        (Lang::Ja, ConsoleTookOver) => "入力を引き継ぎました。前の入力者:",
        (Lang::En, ConsoleClosed) => "The console closed:",
        (Lang::Ja, ConsoleClosed) => "コンソールが閉じました:",
        (Lang::En, ConsoleNotRunning) => "The VM is not running: its console is there while it runs.",
        (Lang::Ja, ConsoleNotRunning) => "VM が実行中ではありません。コンソールは実行中に使えます。",
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
        (Lang::En, GpuFigures) => "GPUs over the last 24 hours (UTC)",
        (Lang::Ja, GpuFigures) => "GPU の過去 24 時間 (UTC)",
        (Lang::En, GpuUtil) => "Utilisation",
        (Lang::Ja, GpuUtil) => "使用率",
        (Lang::En, GpuMemory) => "Memory in use",
        (Lang::Ja, GpuMemory) => "使用メモリ",
        (Lang::En, NoGpuFigures) => "No figures from the guest in this window",
        (Lang::Ja, NoGpuFigures) => "この期間にゲストからの値はありません",
        (Lang::En, GuestSilent) => "The guest does not report its GPUs (it needs the QEMU guest agent and nvidia-smi)",
        (Lang::Ja, GuestSilent) => "ゲストが GPU の状態を報告していません (QEMU ゲストエージェントと nvidia-smi が必要です)",
        (Lang::En, IdleVms) => "Idle GPU VMs",
        (Lang::Ja, IdleVms) => "アイドル状態の GPU VM",
        (Lang::En, NoIdleVms) => "No GPU VM of yours is idle.",
        (Lang::Ja, NoIdleVms) => "アイドル状態の GPU VM はありません。",
        (Lang::En, VolumesEmpty) => "No volume yet: create one below, or `kumo volume create NAME --size-gib N`.",
        (Lang::Ja, VolumesEmpty) => "ボリュームはまだありません。下のフォームか `kumo volume create NAME --size-gib N` で作成します。",
        (Lang::En, Shares) => "Shares",
        (Lang::Ja, Shares) => "共有ストレージ",
        (Lang::En, SharesEmpty) => "No share yet: create one below, or `kumo share create NAME --size-gib N`; VMs mount it with `--share NAME[:/PATH][:ro]`.",
        (Lang::Ja, SharesEmpty) => "共有ストレージはまだありません。下のフォームか `kumo share create NAME --size-gib N` で作成し、VM には `--share NAME[:/PATH][:ro]` でマウントします。",
        (Lang::En, Share) => "Share",
        (Lang::Ja, Share) => "共有ストレージ",
        (Lang::En, Used) => "Used",
        (Lang::Ja, Used) => "使用量",
        (Lang::En, ReadOnly) => "Read-only",
        (Lang::Ja, ReadOnly) => "読み取り専用",
        (Lang::En, MountedIn) => "Mounted in (VM → path)",
        (Lang::Ja, MountedIn) => "マウント先 (VM → パス)",
        (Lang::En, GrowShare) => "Grow a share",
        (Lang::Ja, GrowShare) => "共有ストレージを拡張",
        (Lang::En, Grow) => "Grow",
        (Lang::Ja, Grow) => "拡張",
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
        (Lang::En, NvSwitchPartitions) => "NVSwitch partitions",
        (Lang::Ja, NvSwitchPartitions) => "NVSwitch パーティション",
        (Lang::En, NoNvSwitchPartitions) => "No Fabric Manager partitions: NVLink as the host has it.",
        (Lang::Ja, NoNvSwitchPartitions) => "Fabric Manager のパーティションはありません (NVLink はホストのまま)。",
        (Lang::En, Passthrough) => "Passthrough",
        (Lang::Ja, Passthrough) => "パススルー",
        (Lang::En, PassthroughProblem) => "Why it takes CPU-only VMs only",
        (Lang::Ja, PassthroughProblem) => "CPU のみの VM しか受け付けない理由",
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
        (Lang::En, FleetHealth) => "Fleet health",
        (Lang::Ja, FleetHealth) => "フリートの健全性",
        (Lang::En, Summary) => "Summary",
        (Lang::Ja, Summary) => "概要",
        (Lang::En, Devices) => "Devices",
        (Lang::Ja, Devices) => "デバイス数",
        (Lang::En, QuarantineLimit) => "Automatic quarantine limit: {cap} devices. Out of service now (quarantined, in repair or validating): {out}.",
        (Lang::Ja, QuarantineLimit) => "自動隔離の上限: {cap} 台。現在の使用停止 (隔離中・修理中・検証中): {out} 台。",
        (Lang::En, LimitReached) => "The automatic quarantine limit is reached: Kumo no longer quarantines broken devices by itself. They are marked suspect and wait for an operator — repair, validate or quarantine them below.",
        (Lang::Ja, LimitReached) => "自動隔離の上限に達しています。Kumo は故障したデバイスを自動では隔離しません。要注意として残り、オペレーターの対応を待ちます。下の表で修理・検証・隔離してください。",
        (Lang::En, Warning) => "Warning:",
        (Lang::Ja, Warning) => "警告:",
        (Lang::En, Filter) => "Filter",
        (Lang::Ja, Filter) => "絞り込む",
        (Lang::En, DevicesTitle) => "Devices",
        (Lang::Ja, DevicesTitle) => "デバイス",
        (Lang::En, NeedAttention) => "Needing attention",
        (Lang::Ja, NeedAttention) => "対応が必要",
        (Lang::En, AllHealthy) => "Every device here is healthy.",
        (Lang::Ja, AllHealthy) => "ここにあるデバイスはすべて正常です。",
        (Lang::En, NoDevices) => "No device has reported yet.",
        (Lang::Ja, NoDevices) => "まだデバイスの報告がありません。",
        (Lang::En, HealthyDevices) => "Healthy",
        (Lang::Ja, HealthyDevices) => "正常",
        (Lang::En, PciAddress) => "PCI address",
        (Lang::Ja, PciAddress) => "PCI アドレス",
        (Lang::En, Since) => "Since (UTC)",
        (Lang::Ja, Since) => "この状態になった日時 (UTC)",
        (Lang::En, Why) => "Why",
        (Lang::Ja, Why) => "理由",
        (Lang::En, HeldBy) => "VMs on it",
        (Lang::Ja, HeldBy) => "使用中の VM",
        (Lang::En, AerErrors) => "AER errors (correctable / non-fatal / fatal)",
        (Lang::Ja, AerErrors) => "AER エラー (訂正可能 / 非致命的 / 致命的)",
        (Lang::En, PcieLink) => "PCIe link (width, speed)",
        (Lang::Ja, PcieLink) => "PCIe リンク (幅・速度)",
        (Lang::En, LinkNarrowed) => "x{now} of x{max}",
        (Lang::Ja, LinkNarrowed) => "x{now} (最大 x{max})",
        (Lang::En, SpeedOf) => "{now} of {max} GT/s",
        (Lang::Ja, SpeedOf) => "{now} GT/s (最大 {max} GT/s)",
        (Lang::En, NotOnBus) => "gone from the PCIe bus",
        (Lang::Ja, NotOnBus) => "PCIe バスから消失",
        (Lang::En, NotRead) => "not read yet",
        (Lang::Ja, NotRead) => "未取得",
        (Lang::En, Actions) => "Actions",
        (Lang::Ja, Actions) => "操作",
        (Lang::En, ReasonOptional) => "Reason (optional)",
        (Lang::Ja, ReasonOptional) => "理由 (任意)",
        (Lang::En, SendToRepair) => "Send to repair",
        (Lang::Ja, SendToRepair) => "修理に回す",
        (Lang::En, ValidateRepaired) => "Validate (repaired)",
        (Lang::Ja, ValidateRepaired) => "検証する (修理済み)",
        (Lang::En, QuarantineIt) => "Quarantine",
        (Lang::Ja, QuarantineIt) => "隔離する",
        (Lang::En, DeviceNow) => "{device}: now {state}.",
        (Lang::Ja, DeviceNow) => "{device}: {state}になりました。",
        (Lang::En, DeviceDone) => "{device}: done.",
        (Lang::Ja, DeviceDone) => "{device}: 完了しました。",
        (Lang::En, RoceCongestion) => "RoCE congestion per port",
        (Lang::Ja, RoceCongestion) => "ポートごとの RoCE 輻輳",
        (Lang::En, RoceHelp) => "Totals since the host booted, as the NIC counts them.",
        (Lang::Ja, RoceHelp) => "ホスト起動からの累計 (NIC のカウンター値) です。",
        (Lang::En, NoPorts) => "No RDMA port reported.",
        (Lang::Ja, NoPorts) => "RDMA ポートの報告はありません。",
        (Lang::En, RdmaPort) => "RDMA port",
        (Lang::Ja, RdmaPort) => "RDMA ポート",
        (Lang::En, PortState) => "Port state",
        (Lang::Ja, PortState) => "ポート状態",
        (Lang::En, EcnMarked) => "ECN-marked packets",
        (Lang::Ja, EcnMarked) => "ECN マーク付きパケット",
        (Lang::En, CnpSent) => "CNPs sent",
        (Lang::Ja, CnpSent) => "送信した CNP",
        (Lang::En, CnpHandled) => "CNPs handled",
        (Lang::Ja, CnpHandled) => "処理した CNP",
        (Lang::En, OutOfSequence) => "Out of sequence",
        (Lang::Ja, OutOfSequence) => "順序外パケット",
        (Lang::En, CarrierChanges) => "Carrier changes",
        (Lang::Ja, CarrierChanges) => "キャリア変化",
        (Lang::En, ShowingFirst) => "Showing the first {shown} of {total}: filter by host or state to see the rest.",
        (Lang::Ja, ShowingFirst) => "{total} 件中、最初の {shown} 件を表示しています。残りはホストか状態で絞り込んでください。",
        (Lang::En, CheckFields) => "Nothing was done: correct the fields below and send the form again.",
        (Lang::Ja, CheckFields) => "実行されませんでした。下の項目を直してもう一度送信してください。",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    AppName,
    GpuFigures,
    GpuUtil,
    GpuMemory,
    NoGpuFigures,
    GuestSilent,
    IdleVms,
    NoIdleVms,
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
    Console,
    ConsoleHelp,
    ConsoleNoTerminal,
    SendText,
    SendTextHelp,
    PressEnter,
    Send,
    Power,
    PowerHelp,
    TakeOver,
    Reconnect,
    ConsoleConnecting,
    ConsoleWriting,
    ConsoleReading,
    ConsoleTakenOver,
    ConsoleReadOnly,
    ConsoleTookOver,
    ConsoleClosed,
    ConsoleNotRunning,
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
    Shares,
    SharesEmpty,
    Share,
    Used,
    ReadOnly,
    MountedIn,
    GrowShare,
    Grow,
    SizeGib,
    InGuest,
    AttachVolume,
    Attach,
    Fabric,
    Passthrough,
    PassthroughProblem,
    NvSwitchPartitions,
    NoNvSwitchPartitions,
    SignInToken,
    Token,
    Any,
    Template,
    FleetHealth,
    Summary,
    Devices,
    QuarantineLimit,
    LimitReached,
    Warning,
    Filter,
    DevicesTitle,
    NeedAttention,
    AllHealthy,
    NoDevices,
    HealthyDevices,
    PciAddress,
    Since,
    Why,
    HeldBy,
    AerErrors,
    PcieLink,
    LinkNarrowed,
    SpeedOf,
    NotOnBus,
    NotRead,
    Actions,
    ReasonOptional,
    SendToRepair,
    ValidateRepaired,
    QuarantineIt,
    DeviceNow,
    DeviceDone,
    RoceCongestion,
    RoceHelp,
    NoPorts,
    RdmaPort,
    PortState,
    EcnMarked,
    CnpSent,
    CnpHandled,
    OutOfSequence,
    CarrierChanges,
    ShowingFirst,
    CheckFields,
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
    fn mount_conditions_in_japanese() {
        assert_eq!(mount_condition(Lang::Ja, "mounted"), "マウント済み");
        assert_eq!(
            mount_condition(Lang::Ja, "failed: no such directory"),
            "失敗: no such directory"
        );
        assert_eq!(
            mount_condition(
                Lang::Ja,
                "read-only from the next start (libvirt cannot change a running VM's share)"
            ),
            "次回起動から読み取り専用（実行中の VM の共有は変更できません）"
        );
        assert_eq!(mount_condition(Lang::En, "mounted"), "mounted");
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

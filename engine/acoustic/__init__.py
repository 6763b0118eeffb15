"""The acoustic stage: semantic tokens to audio. SoVITS streaming decode (``streaming``), the v3/v4 CFM and
vocoder synthesis (``cfm``), their mels (``mel``), the vocoder backend switch (``vocoder_backend``) and the
HuBERT reference features (``hubert``)."""

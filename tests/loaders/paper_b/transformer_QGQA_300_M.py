"""The model classes of Brainchip-Inc/Do-Transformers-Need-3-Projections
``transformer_QGQA_300_M.py`` (commit ffedd92e, MIT licence, see LICENSE and SOURCES.md here).

Vendored verbatim from ``class ModelConfig`` to the end of the GPT class; cut
out: the imports of the training stack, ``TrainingConfig`` and everything after
the model (data loading, training loop). ``flash_attn`` is absent, so the
standard attention path runs (``FLASH_AVAILABLE = False``).
"""
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

FLASH_AVAILABLE = False
flash_attn_func = None


@dataclass
class ModelConfig:
    """Model architecture configuration"""
    vocab_size: int = 50304
    n_positions: int = 2048
    n_layer: int = 20
    n_embd: int = 1024
    n_head: int = 16
    n_kv_groups: int = 8
    n_inner: int = 4096
    
    embd_pdrop: float = 0.0
    resid_pdrop: float = 0.1
    attn_pdrop: float = 0.0
    
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    use_bias: bool = True
    tie_word_embeddings: bool = True
    
    use_flash_attention: bool = True


# ============================================================================
# MODEL: Q-GQA ATTENTION (Hybrid: Grouped-Query + K=V)
# ============================================================================

class QGQAttention(nn.Module):
    """
    Q-GQA: Hybrid of Grouped-Query Attention + K=V constraint
    
    This is the ULTIMATE cache-saving attention mechanism!
    
    Key characteristics:
    - Full Q projection with n_head heads (e.g., 16 heads) - maintains expressiveness
    - Reduced K projection with n_kv_groups heads (e.g., 4 groups) - GQA's trick
    - V = K (no separate V projection) - Q-KV's trick
    - Each K group is shared by n_head/n_kv_groups query heads AND used as V
    
    Benefits:
    - 87.5% KV cache reduction vs standard QKV (16 K + 16 V → 4 K only!)
    - 75% reduction vs GQA (4 K + 4 V → 4 K only)
    - 50% reduction vs Q-KV (16 K → 4 K)
    - Maintains asymmetric attention (Q independent)
    - Production-viable combination of proven techniques
    
    Example with n_head=16, n_kv_groups=4:
    - 16 separate query heads (full expressiveness)
    - 4 key heads (each shared by 4 query heads)
    - V = K, so no additional projection or cache needed
    - Cache: 4 K heads only (vs 16 K + 16 V in QKV)
    
    Expected quality: Between GQA and Q-KV, likely ~5.3-5.5 PPL
    - Better than K model (6.41 PPL) due to independent Q
    - Possibly slightly worse than GQA (~5.15-5.25 PPL) due to K=V constraint
    - But with MAXIMUM cache savings!
    """
    
    def __init__(self, config: ModelConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        assert config.n_head % config.n_kv_groups == 0, \
            f"n_head ({config.n_head}) must be divisible by n_kv_groups ({config.n_kv_groups})"
        
        self.n_embd = config.n_embd
        self.n_head = config.n_head
        self.n_kv_groups = config.n_kv_groups
        self.n_head_per_group = config.n_head // config.n_kv_groups
        self.head_dim = config.n_embd // config.n_head
        self.dropout = config.attn_pdrop
        self.use_flash = config.use_flash_attention and FLASH_AVAILABLE
        
        # Full query projection (all n_head heads)
        self.c_q = nn.Linear(config.n_embd, config.n_embd, bias=config.use_bias)
        
        # REDUCED K projection (only n_kv_groups heads)
        # This is the KEY difference: combining GQA's grouping with Q-KV's K=V
        k_dim = self.n_kv_groups * self.head_dim
        self.c_k = nn.Linear(config.n_embd, k_dim, bias=config.use_bias)
        # NO c_v projection! V will reuse K
        
        # Output projection (same as all variants)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.use_bias)
        
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        
        # Causal mask
        self.register_buffer(
            "bias",
            torch.tril(torch.ones(config.n_positions, config.n_positions))
            .view(1, 1, config.n_positions, config.n_positions)
        )
        
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x: [batch, seq_len, n_embd]
            
        Returns:
            out: [batch, seq_len, n_embd]
        """
        B, T, C = x.size()
        
        # Query projection: Full n_head heads
        q = self.c_q(x)  # [B, T, n_embd]
        q = q.view(B, T, self.n_head, self.head_dim)  # [B, T, n_head, head_dim]
        
        # Key projection: Only n_kv_groups heads (GROUPED like GQA)
        k = self.c_k(x)  # [B, T, n_kv_groups * head_dim]
        k = k.view(B, T, self.n_kv_groups, self.head_dim)  # [B, T, n_kv_groups, head_dim]
        
        # V = K (NO separate projection, like Q-KV model!)
        # This is the SECOND key difference
        v = k  # [B, T, n_kv_groups, head_dim]
        
        # Repeat K and V heads to match number of query heads
        # Each KV group is used by n_head_per_group query heads
        # Example: [B, T, 4, head_dim] -> [B, T, 16, head_dim] with each group repeated 4 times
        k = k.repeat_interleave(self.n_head_per_group, dim=2)  # [B, T, n_head, head_dim]
        v = v.repeat_interleave(self.n_head_per_group, dim=2)  # [B, T, n_head, head_dim]
        
        # Now q, k, v all have shape [B, T, n_head, head_dim]
        # But k and v:
        #   1. Came from only n_kv_groups projections (GQA's trick)
        #   2. Are the same tensor (Q-KV's trick)
        # Result: MAXIMUM cache savings!
        
        # Choose attention implementation
        if self.use_flash:
            # Flash Attention: [B, T, n_head, head_dim]
            out = flash_attn_func(
                q, k, v,
                dropout_p=self.dropout if self.training else 0.0,
                causal=True
            )
        else:
            # Standard attention
            # Transpose to [B, n_head, T, head_dim]
            q = q.transpose(1, 2)
            k = k.transpose(1, 2)
            v = v.transpose(1, 2)
            
            # Attention scores: [B, n_head, T, T]
            # Q @ K^T is NOT symmetric (Q independent)
            # This gives better expressiveness than K model (Q=K=V)
            scale = 1.0 / math.sqrt(self.head_dim)
            attn = torch.matmul(q, k.transpose(-2, -1)) * scale
            
            # Apply causal mask
            attn = attn.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
            
            # Softmax
            attn = F.softmax(attn, dim=-1)
            attn = self.attn_dropout(attn)
            
            # Apply attention to values (which are K!)
            out = torch.matmul(attn, v)  # [B, n_head, T, head_dim]
            out = out.transpose(1, 2)    # [B, T, n_head, head_dim]
        
        # Merge heads
        out = out.contiguous().view(B, T, C)
        
        # Output projection
        out = self.c_proj(out)
        out = self.resid_dropout(out)
        
        return out


class MLP(nn.Module):
    """Feed-forward network (identical across all variants)"""
    
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.n_inner, bias=config.use_bias)
        self.c_proj = nn.Linear(config.n_inner, config.n_embd, bias=config.use_bias)
        self.act = nn.GELU()
        self.dropout = nn.Dropout(config.resid_pdrop)
        
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.c_fc(x)
        x = self.act(x)
        x = self.c_proj(x)
        x = self.dropout(x)
        return x


class TransformerBlock(nn.Module):
    """Single transformer block with Q-GQA"""
    
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = QGQAttention(config)  # Q-GQA: Grouped + K=V!
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)
        
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT_Q_GQA(nn.Module):
    """GPT Language Model with Q-GQA Attention (Hybrid: Grouped-Query + K=V)"""
    
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        
        # Token and position embeddings (identical to all variants)
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        
        # Transformer blocks with Q-GQA
        self.h = nn.ModuleList([TransformerBlock(config) for _ in range(config.n_layer)])
        
        # Final layer norm
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        
        # LM head (tied with token embeddings if specified)
        if config.tie_word_embeddings:
            self.lm_head = lambda x: F.linear(x, self.wte.weight)
        else:
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        
        # Initialize weights
        self.apply(self._init_weights)
        
    def _init_weights(self, module):
        """Initialize weights (GPT-2 style)"""
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
        elif isinstance(module, nn.LayerNorm):
            torch.nn.init.zeros_(module.bias)
            torch.nn.init.ones_(module.weight)
    
    def forward(
        self,
        input_ids: torch.Tensor,
        labels: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """
        Args:
            input_ids: [batch, seq_len] token indices
            labels: [batch, seq_len] target token indices (for training)
            
        Returns:
            logits: [batch, seq_len, vocab_size]
            loss: scalar (if labels provided)
        """
        device = input_ids.device
        b, t = input_ids.size()
        assert t <= self.config.n_positions, f"Sequence length {t} exceeds maximum {self.config.n_positions}"
        
        # Token embeddings
        tok_emb = self.wte(input_ids)  # [b, t, n_embd]
        
        # Position embeddings
        pos = torch.arange(0, t, dtype=torch.long, device=device).unsqueeze(0)  # [1, t]
        pos_emb = self.wpe(pos)  # [1, t, n_embd]
        
        # Combined embeddings
        x = self.drop(tok_emb + pos_emb)
        
        # Transformer blocks
        for block in self.h:
            x = block(x)
        
        # Final layer norm
        x = self.ln_f(x)
        
        # LM head
        logits = self.lm_head(x)  # [b, t, vocab_size]
        
        # Calculate loss if labels provided
        loss = None
        if labels is not None:
            # Shift logits and labels for next-token prediction
            shift_logits = logits[..., :-1, :].contiguous()
            shift_labels = labels[..., 1:].contiguous()
            
            # Cross entropy loss
            loss = F.cross_entropy(
                shift_logits.view(-1, shift_logits.size(-1)),
                shift_labels.view(-1),
                ignore_index=-100
            )
        
        return logits, loss
    
    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: Optional[int] = None
    ) -> torch.Tensor:
        """
        Generate tokens autoregressively
        
        Args:
            idx: [batch, seq_len] conditioning sequence
            max_new_tokens: number of tokens to generate
            temperature: sampling temperature (higher = more random)
            top_k: if set, only sample from top k tokens
            
        Returns:
            idx: [batch, seq_len + max_new_tokens]
        """
        for _ in range(max_new_tokens):
            # Crop context if needed
            idx_cond = idx if idx.size(1) <= self.config.n_positions else idx[:, -self.config.n_positions:]
            
            # Forward pass
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature  # [batch, vocab_size]
            
            # Optional top-k sampling
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float('Inf')
            
            # Sample
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            
            # Append to sequence
            idx = torch.cat((idx, idx_next), dim=1)
        
        return idx
